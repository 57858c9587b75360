"""The tiling engine behind ``impl="tiled"`` and every sharded strategy (docs/derivations.md §13,
§14).

Lowest first: :mod:`.tile` (one tile: blocks of rows, masks from ids, the running normalisers,
``Gamma``), :mod:`.row_exchange` (how the other devices' rows arrive: in place, all-gathered or
round a ring), :mod:`.tile_loops` (the loops over the tile pairs of two chunks: statistics,
gradients) and :mod:`.custom_vjps` (the tiled losses' forward and hand-written backward passes).
The public losses (:mod:`contrastive_jax.losses.clip`, ``.nt_xent``, ``.siglip``, ``.sharded``)
call :mod:`.custom_vjps`; nothing here imports them.
"""
