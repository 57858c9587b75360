"""Text: captions, tokenizers and zero-shot prompts.

- :mod:`~contrastive_jax.training.data.text.captions`: the digit captions' templates, the word
  vocabulary (``vocab.txt`` beside it), ``tokenize`` / ``detokenize``, caption ids and the
  class prompts of zero-shot classification;
- :mod:`~contrastive_jax.training.data.text.text_tokenizers`: the caption tokenizers of
  ``data.preprocess.tokenizer`` (a word vocabulary, SentencePiece, CLIP's BPE, SigLIP's
  SentencePiece); id 0 is padding but for CLIP's BPE (0 is ``!``) and SigLIP's (padding
  ``</s>`` = 1);
- :mod:`~contrastive_jax.training.data.text.clip_bpe`: OpenAI CLIP's byte-level BPE tokenizer
  (open_clip's ``tokenize`` ids);
- :mod:`~contrastive_jax.training.data.text.open_clip_sentencepiece`: SigLIP's SentencePiece
  tokenizer as open_clip applies it (its ``HFTokenizer`` ids);
- :mod:`~contrastive_jax.training.data.text.prompt_templates`: zero-shot prompts from class
  names and templates, and their token ids.
"""
