"""Pre-LayerNorm Transformer encoders: a ViT for images and a text tower for tokens.

The defaults are this project's own towers (mean pooling, an output layer with a bias, tanh-GELU,
LayerNorm eps 1e-6). The options express OpenAI's CLIP ([CLIP] in docs/references.md) and
open_clip's ViT-CLIP exactly (``models/converters/clip_import.py`` sets them from a
checkpoint): a class token, ``ln_pre``, pooling at the class token or (text) at the largest
token id, a causal mask, exact or quick GELU, LayerNorm eps 1e-5, no output layer (the dual
encoder's bias-free projection is CLIP's ``proj`` / ``text_projection``) and a patch
convolution without bias. They also express SigLIP's towers ([SigLIP]) as open_clip builds them
([OpenCLIP]): timm's ViT without class token, pooled by an attention-pool head with one latent
query (:class:`MapHead`, ``pool="map"``), and a text tower without causal mask pooled at the last
position (``pool="last"``); and open_clip's other text pools (``"first"``, ``"eos"``) and its
``final_ln_after_pool`` for the mean pool (``norm_after_pool``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from contrastive_jax.errors import ConfigError
from contrastive_jax.training.models.dropout import (
    ExampleDropout,
    check_patch_dropout,
    drop_patches,
    fold_each,
    kept_patches,
)
from contrastive_jax.training.models.encoders.activations import ACTIVATIONS, check_activation
from contrastive_jax.training.models.encoders.attention import attention_function, check_attention
from contrastive_jax.training.models.encoders.map_head import MapHead
from contrastive_jax.training.models.precision import cast
from contrastive_jax.training.models.remat import checkpointed
from contrastive_jax.training.models.scanned_layers import check_scan, scan_blocks, stacked


def mlp_hidden(width: int, mlp_ratio: int, mlp_width: int | None) -> int:
    """The MLP's hidden width: ``mlp_width`` when given (checkpoints whose hidden width is not a
    whole multiple of ``width``, e.g. ViT-bigG's 8192 for 1664), else ``mlp_ratio * width``."""
    if mlp_width is None:
        return mlp_ratio * width
    if not isinstance(mlp_width, int) or mlp_width < 1:
        raise ConfigError(f"mlp_width must be a positive integer or None; got {mlp_width!r}")
    return mlp_width


class Block(nnx.Module):
    """``x + MHA(LN(x))``, then ``x + fc2(act(fc1(LN(x))))`` (hidden ``mlp_ratio * width`` or
    ``mlp_width``), as CLIP's ``ResidualAttentionBlock`` ([CLIP]).

    The attention has biases on q, k, v and the output (torch's ``in_proj_bias`` and
    ``out_proj.bias``) and scales by ``1 / sqrt(width / heads)``. ``activation``: a key of
    :data:`ACTIVATIONS`; ``layer_norm_eps``: both LayerNorms' epsilon (Flax's default 1e-6,
    torch's 1e-5). ``dtype``: the compute dtype (:mod:`.precision`; ``None``: the parameters'
    own); the parameters are float32 either way and LayerNorm's statistics and the softmax
    float32. ``attention``: the kernel (:mod:`.attention`, ``model.attention``); ``causal``:
    token ``t`` attends to tokens ``<= t`` only (CLIP's text tower).
    """

    def __init__(self, width: int, heads: int, mlp_ratio: int, dropout: float, *,
                 activation: str = "gelu_tanh", layer_norm_eps: float = 1e-6,
                 mlp_width: int | None = None, dtype=None, attention: str = "auto",
                 causal: bool = False, rngs: nnx.Rngs):
        if width % heads:
            raise ConfigError(f"width {width} must be a multiple of heads {heads}")
        hidden = mlp_hidden(width, mlp_ratio, mlp_width)
        self.norm1 = nnx.LayerNorm(width, epsilon=layer_norm_eps, dtype=dtype, rngs=rngs)
        self.attention = nnx.MultiHeadAttention(
            heads, width, decode=False, rngs=rngs, keep_rngs=False, dtype=dtype,
            attention_fn=attention_function(check_attention(attention, dtype=dtype),
                                            causal=causal))
        self.norm2 = nnx.LayerNorm(width, epsilon=layer_norm_eps, dtype=dtype, rngs=rngs)
        self.fc1 = nnx.Linear(width, hidden, dtype=dtype, rngs=rngs)
        self.fc2 = nnx.Linear(hidden, width, dtype=dtype, rngs=rngs)
        self.dropout = ExampleDropout(dropout)
        self.activation = check_activation(activation)

    def __call__(self, x: jax.Array, mask: jax.Array | None, *, train: bool,
                 dropout_keys: jax.Array | None) -> jax.Array:
        """``x (B, T, width)``; ``dropout_keys (B,)``: this block's per-example keys."""
        h = self.attention(self.norm1(x), mask=mask, deterministic=True)
        x = x + self.dropout(h, keys=fold_each(dropout_keys, 0), train=train)
        h = self.fc2(ACTIVATIONS[self.activation](self.fc1(self.norm2(x))))
        return x + self.dropout(h, keys=fold_each(dropout_keys, 1), train=train)


def make_blocks(depth: int, scan: bool, *args, rngs: nnx.Rngs, **kwargs):
    """``depth`` :class:`Block` s (``Block(*args, **kwargs)``, drawn in order from ``rngs``):
    an ``nnx.List`` (``scan=False``, parameters ``blocks/<i>/...``) or the same blocks stacked
    into one module (``scan=True``, parameters ``blocks/...`` with a leading layer axis,
    :mod:`~contrastive_jax.training.models.scanned_layers`)."""
    blocks = [Block(*args, **kwargs, rngs=rngs) for _ in range(depth)]
    if not scan:
        return nnx.List(blocks)
    if depth < 1:
        raise ConfigError(f"scan=True needs at least one block; got depth {depth}")
    return stacked(blocks)


def run_blocks(blocks, h: jax.Array, mask: jax.Array | None, *, train: bool,
               dropout_keys: jax.Array | None, remat_policy: str | None,
               scan: bool = False) -> jax.Array:
    """``h (B, T, width)`` through each :class:`Block` in turn (block ``i`` folds ``i`` into the
    dropout keys), each rematerialised under ``remat_policy`` (:mod:`.remat`; ``None``: off);
    with ``scan``, ``blocks`` is the stacked module of :func:`make_blocks` and the blocks run as
    one ``lax.scan`` (:func:`~contrastive_jax.training.models.scanned_layers.scan_blocks`)."""
    def block_fn(block, h, mask, keys):
        return block(h, mask, train=train, dropout_keys=keys)

    if scan:
        return scan_blocks(blocks, lambda block, h, i: block_fn(
            block, h, mask, fold_each(dropout_keys, i)), h, policy=remat_policy)
    step = checkpointed(block_fn, remat_policy)
    for depth, block in enumerate(blocks):
        h = step(block, h, mask, fold_each(dropout_keys, depth))
    return h


VIT_POOLS = ("mean", "token", "map")
TEXT_POOLS = ("mean", "argmax", "last", "first", "eos")


def _output_layer(width: int, features: int | None, dtype, rngs: nnx.Rngs):
    """``(Linear(width, features) or None, features of the tower)``: ``features=None`` means no
    output layer, the tower's features are the pooled, normalised ``width`` vector (CLIP: the
    dual encoder's bias-free projection is the checkpoint's ``proj`` / ``text_projection``)."""
    if features is None:
        return None, width
    return nnx.Linear(width, features, dtype=dtype, rngs=rngs), features


class ViT(nnx.Module):
    """Vision Transformer: ``patch x patch`` patches, learned positions, Transformer blocks,
    then pooling, LayerNorm and (optionally) an output layer ([CLIP], [OpenCLIP]).

    Input ``(B, H, W, C)``, output ``(B, features)`` in the compute dtype::

        h = conv(x) + positions                      (B, (H/patch)^2, width)
        h = [class_embedding; h] + positions         with class_token (positions: one more row)
        h = norm_pre(h)                              with pre_norm (CLIP's ln_pre)
        h = blocks(h)
        z = mean_t norm(h_t)  (pool="mean", over the patch tokens)  or
            norm(mean_t h_t)  (pool="mean", norm_after_pool=True)  or
            norm(h_0)         (pool="token", the class token; CLIP's ln_post)  or
            map(norm(h_t))    (pool="map", over the patch tokens: :class:`MapHead`)
        out(z)  (features: int)  or  z  (features=None, width features)

    The defaults are this project's ViT; ``class_token=True, pre_norm=True, pool="token",
    features=None, patch_bias=False, activation="quick_gelu" or "gelu", layer_norm_eps=1e-5``
    is OpenAI's / open_clip's ``VisionTransformer`` (whose ``proj`` is the dual encoder's
    ``sample_proj``). ``class_token=False, pool="map", features=None, activation="gelu",
    layer_norm_eps=1e-6`` (``patch_bias=True, pre_norm=False``, the defaults) is timm's
    ``VisionTransformer(class_token=False, global_pool="map")``, SigLIP's image tower in open_clip
    ([SigLIP], [OpenCLIP]); its head has the blocks' heads, MLP hidden width, activation and
    epsilon. ``norm_after_pool=True`` (only with ``pool="mean"``) is open_clip's
    ``final_ln_after_pool`` / timm's ``fc_norm`` for the average pool: the LayerNorm of the mean
    instead of the mean of the LayerNorms. Dropout (``dropout > 0`` and ``train``) needs
    ``dropout_keys``: one PRNG key per example (:mod:`.dropout`). ``dtype``: the compute dtype
    (:mod:`.precision`); ``remat_policy``: each block rematerialised under that policy
    (:mod:`.remat`; ``None``: off; the attention-pool head is not); ``attention``: the
    attention kernel (:mod:`.attention`). The three are set from ``config.model`` by
    :func:`~contrastive_jax.training.models.build_model`. ``scan=True`` (default): the blocks
    stacked and run as one ``lax.scan`` (parameters ``blocks/<name>`` with a leading layer
    axis); ``scan=False``: unrolled (``blocks/<i>/<name>``); the same function, initial values
    and randomness either way (:mod:`~contrastive_jax.training.models.scanned_layers`).
    ``patch_dropout = p`` (FLIP's patch masking, open_clip's ``patch_dropout``; [FLIP]): in
    training each example keeps ``kept_patches(patches, p)`` of its patch tokens, after the
    position embedding is added and before ``norm_pre`` (the class token always kept; the
    pools see what is kept): :func:`drop_patches`. Evaluation (``train=False``) never drops.
    """

    @staticmethod
    def input_shape(settings: Mapping[str, Any], image_size: int | None = None
                    ) -> tuple[int, ...]:
        """One example's input, ``(image_size, image_size, in_channels)``."""
        return (settings["image_size"], settings["image_size"], settings["in_channels"])

    def __init__(self, *, image_size: int, patch: int, in_channels: int = 3, width: int = 128,
                 depth: int = 4, heads: int = 4, mlp_ratio: int = 4, dropout: float = 0.0,
                 features: int | None = 128, class_token: bool = False, pre_norm: bool = False,
                 pool: str = "mean", patch_bias: bool = True, activation: str = "gelu_tanh",
                 layer_norm_eps: float = 1e-6, mlp_width: int | None = None,
                 norm_after_pool: bool = False, scan: bool = True, patch_dropout: float = 0.0,
                 dtype=None, remat_policy: str | None = None, attention: str = "auto",
                 rngs: nnx.Rngs):
        if image_size % patch:
            raise ConfigError(f"image_size {image_size} must be a multiple of patch {patch}")
        if pool not in VIT_POOLS:
            raise ConfigError(f"ViT pool must be one of {list(VIT_POOLS)}; got {pool!r}")
        if pool == "token" and not class_token:
            raise ConfigError("ViT pool='token' reads the class token: set class_token=True")
        if not isinstance(norm_after_pool, bool):
            raise ConfigError(f"ViT norm_after_pool must be True or False; got "
                              f"{norm_after_pool!r}")
        if norm_after_pool and pool != "mean":
            raise ConfigError(f"ViT norm_after_pool=True (LayerNorm of the token mean) applies to "
                              f"pool='mean' only; got pool={pool!r}: set norm_after_pool=False")
        self.embed = nnx.Conv(in_channels, width, (patch, patch), strides=patch,
                              padding="VALID", use_bias=patch_bias, dtype=dtype, rngs=rngs)
        tokens = (image_size // patch) ** 2 + int(class_token)
        self.positions = nnx.Param(0.02 * jax.random.normal(rngs.params(), (1, tokens, width)))
        self.class_embedding = (nnx.Param(0.02 * jax.random.normal(rngs.params(), (1, 1, width)))
                                if class_token else None)
        self.norm_pre = (nnx.LayerNorm(width, epsilon=layer_norm_eps, dtype=dtype, rngs=rngs)
                         if pre_norm else None)
        self.scan = check_scan(scan, "vit")
        self.blocks = make_blocks(depth, scan, width, heads, mlp_ratio, dropout,
                                  activation=activation, layer_norm_eps=layer_norm_eps,
                                  mlp_width=mlp_width, dtype=dtype, attention=attention,
                                  rngs=rngs)
        self.norm = nnx.LayerNorm(width, epsilon=layer_norm_eps, dtype=dtype, rngs=rngs)
        self.map_head = (MapHead(width, heads, mlp_hidden(width, mlp_ratio, mlp_width),
                                 activation=activation, layer_norm_eps=layer_norm_eps,
                                 dtype=dtype, attention=attention, rngs=rngs)
                         if pool == "map" else None)
        self.out, self.features = _output_layer(width, features, dtype, rngs)
        self.image_size, self.in_channels, self.pool = image_size, in_channels, pool
        self.norm_after_pool, self.remat_policy = norm_after_pool, remat_policy
        self.patch_dropout = check_patch_dropout(patch_dropout)
        self.kept = kept_patches((image_size // patch) ** 2, self.patch_dropout)

    def __call__(self, x: jax.Array, *, train: bool,
                 dropout_keys: jax.Array | None = None) -> jax.Array:
        if x.ndim != 4 or x.shape[1:] != (self.image_size, self.image_size, self.in_channels):
            raise ConfigError(f"ViT expects (batch, {self.image_size}, {self.image_size}, "
                             f"{self.in_channels}) images; got shape {x.shape}")
        h = self.embed(x)
        h = h.reshape(h.shape[0], -1, h.shape[-1])
        if self.class_embedding is not None:
            first = jnp.broadcast_to(self.class_embedding[...].astype(h.dtype),
                                     (h.shape[0], 1, h.shape[-1]))
            h = jnp.concatenate([first, h], axis=1)
        h = h + self.positions[...].astype(h.dtype)
        if train and self.patch_dropout > 0:
            h = drop_patches(h, dropout_keys, self.kept, int(self.class_embedding is not None))
        if self.norm_pre is not None:
            h = self.norm_pre(h)
        h = run_blocks(self.blocks, h, None, train=train, dropout_keys=dropout_keys,
                       remat_policy=self.remat_policy, scan=self.scan)
        patches = h[:, int(self.class_embedding is not None):]  # timm / open_clip pool these
        if self.pool == "token":
            z = self.norm(h[:, 0])
        elif self.pool == "map":
            z = self.map_head(self.norm(patches))
        elif self.norm_after_pool:
            z = self.norm(jnp.mean(patches, axis=1))
        else:
            z = jnp.mean(self.norm(patches), axis=1)
        return z if self.out is None else self.out(z)


class TextTransformer(nnx.Module):
    """Text tower: token + position embeddings, Transformer blocks, LayerNorm, pooling and
    (optionally) an output layer ([CLIP]).

    Input ``(B, T)`` int token ids, output ``(B, features)`` in the compute dtype::

        h = tokens[ids] + positions                  (B, T, width)
        h = blocks(h)                                attention masked as below
        z = pool(norm(h))
        out(z)  (features: int)  or  z  (features=None, width features)

    ``pool="mean"`` (default): id 0 is padding, masked out of attention and of the mean over
    the real tokens. ``pool="argmax"``: ``z_b = norm(h)[b, argmax_t ids[b, t]]``, the position of
    the largest id, which in CLIP's vocabulary is the end-of-text token (OpenAI's
    ``text.argmax(dim=-1)``, open_clip's ``pool_type='argmax'``); no padding mask (id 0 is a real
    token there, ``'!'``). The other selection pools are open_clip's ``text_global_pool``
    ([OpenCLIP]): ``pool="last"``: ``z_b = norm(h)[b, T - 1]`` (SigLIP's text tower, [SigLIP],
    whose tokenizer pads every caption to ``T``); ``pool="first"``: ``z_b = norm(h)[b, 0]``;
    ``pool="eos"`` with ``eos_id``: ``z_b = norm(h)[b, t_b]``, ``t_b`` the first position with
    ``ids[b, t] == eos_id`` and ``0`` when there is none (open_clip's ``(text ==
    eos_id).int().argmax(-1)``). None of the selection pools masks padding. ``causal=True``:
    token ``t`` attends to tokens ``<= t`` only (CLIP's ``attn_mask``), combined with the padding
    mask under ``pool="mean"``; ``causal=False`` with a selection pool is full attention, no mask
    at all (open_clip's ``no_causal_mask``). ``features=None, pool="argmax", causal=True,
    activation="quick_gelu" or "gelu", layer_norm_eps=1e-5`` is OpenAI's / open_clip's text
    tower (whose ``text_projection`` is the dual encoder's ``text_proj``); ``features=None,
    pool="last", causal=False, activation="gelu", layer_norm_eps=1e-6`` is open_clip's SigLIP
    text tower (its ``text_projection`` with bias: the dual encoder's
    ``text_projection="linear_bias"``). ``dtype`` and ``remat_policy`` as :class:`ViT`.
    """

    @staticmethod
    def input_shape(settings: Mapping[str, Any], image_size: int | None = None
                    ) -> tuple[int, ...]:
        """One example's input, ``(max_tokens,)`` token ids."""
        return (settings["max_tokens"],)

    def __init__(self, *, vocab_size: int, max_tokens: int, width: int = 128, depth: int = 2,
                 heads: int = 4, mlp_ratio: int = 4, dropout: float = 0.0,
                 features: int | None = 128, causal: bool = False, pool: str = "mean",
                 eos_id: int | None = None, activation: str = "gelu_tanh",
                 layer_norm_eps: float = 1e-6, mlp_width: int | None = None, scan: bool = True,
                 dtype=None, remat_policy: str | None = None, attention: str = "auto",
                 rngs: nnx.Rngs):
        if pool not in TEXT_POOLS:
            raise ConfigError(f"TextTransformer pool must be one of {list(TEXT_POOLS)}; got "
                              f"{pool!r}")
        if pool == "eos":
            if eos_id is None:
                raise ConfigError("TextTransformer pool='eos' selects the first position whose "
                                  "id is eos_id: set eos_id (an integer token id)")
            if (isinstance(eos_id, bool) or not isinstance(eos_id, int)
                    or not 0 <= eos_id < vocab_size):
                raise ConfigError(f"TextTransformer eos_id must be a token id in [0, "
                                  f"{vocab_size}) (vocab_size {vocab_size}); got {eos_id!r}")
        elif eos_id is not None:
            raise ConfigError(f"TextTransformer eos_id={eos_id!r} is used by pool='eos' only; "
                              f"got pool={pool!r}: remove eos_id or set pool='eos'")
        self.tokens = nnx.Embed(vocab_size, width, rngs=rngs)
        self.positions = nnx.Param(0.02 * jax.random.normal(rngs.params(),
                                                            (1, max_tokens, width)))
        self.scan = check_scan(scan, "text_transformer")
        self.blocks = make_blocks(depth, scan, width, heads, mlp_ratio, dropout,
                                  activation=activation, layer_norm_eps=layer_norm_eps,
                                  mlp_width=mlp_width, dtype=dtype, attention=attention,
                                  causal=causal, rngs=rngs)
        self.norm = nnx.LayerNorm(width, epsilon=layer_norm_eps, dtype=dtype, rngs=rngs)
        self.out, self.features = _output_layer(width, features, dtype, rngs)
        self.vocab_size, self.max_tokens = vocab_size, max_tokens
        self.causal, self.pool, self.eos_id = causal, pool, eos_id
        self.dtype, self.remat_policy = dtype, remat_policy

    def __call__(self, tokens: jax.Array, *, train: bool,
                 dropout_keys: jax.Array | None = None) -> jax.Array:
        if tokens.ndim != 2 or tokens.shape[1] != self.max_tokens:
            raise ConfigError(f"TextTransformer expects (batch, {self.max_tokens}) token ids; "
                             f"got shape {tokens.shape}")
        if not jnp.issubdtype(tokens.dtype, jnp.integer):
            raise ConfigError(f"token ids must be integers; got {tokens.dtype}")
        real = tokens != 0
        # (B, heads, query, key); the causal part is the blocks' own (Block(causal=...))
        mask = real[:, None, None, :] if self.pool == "mean" else None
        # the lookup in the table's own dtype (nnx.Embed casts to the dtype it was built with,
        # which would turn a float64 model's gradient sums into float32 ones)
        # (then cast to the compute dtype; no-op by default)
        h = cast(jnp.take(self.tokens.embedding[...], tokens, axis=0) + self.positions[...],
                 self.dtype)
        h = run_blocks(self.blocks, h, mask, train=train, dropout_keys=dropout_keys,
                       remat_policy=self.remat_policy, scan=self.scan)
        if self.pool == "mean":
            h = self.norm(h) * real[..., None]
            z = h.sum(1) / jnp.maximum(real.sum(1, keepdims=True), 1)
        else:  # LayerNorm acts on each token: selecting first is open_clip's ln_final, then pool
            z = self.norm(jnp.take_along_axis(h, self._pooled(tokens)[:, None, None],
                                              axis=1)[:, 0])
        return z if self.out is None else self.out(z)

    def _pooled(self, tokens: jax.Array) -> jax.Array:
        """``(B,)`` the position each selection pool reads (see the class docstring)."""
        if self.pool == "argmax":
            return jnp.argmax(tokens, axis=-1)
        if self.pool == "eos":  # the first match; 0 when absent (argmax of all-False)
            return jnp.argmax(tokens == self.eos_id, axis=-1)
        position = self.max_tokens - 1 if self.pool == "last" else 0
        return jnp.full(tokens.shape[:1], position, jnp.int32)
