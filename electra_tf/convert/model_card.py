"""The README.md model card of a Hugging Face export: sizes, data, training, metrics, usage.

Everything comes from the run directory: `config.json` (model and training hparams), the
dataset manifest copy (`dataset_manifest.json`: what the data was built from), `eval_results.txt`
(held-out metrics, if evaluated) and the exported checkpoint's step. Nothing is invented: a
missing source is said to be missing.
"""

from __future__ import annotations

import json
import os
from typing import Mapping, Optional

from electra_tf.training import run_dir

README_NAME = "README.md"


def _read_manifest(model_dir: str) -> Optional[dict]:
    try:
        with open(os.path.join(model_dir, run_dir.DATASET_MANIFEST_COPY), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _precision(config) -> str:
    """The precision setting, and what it resolved to on the training device when recorded."""
    resolved = config.resolved_mixed_precision
    if resolved is None or resolved == config.mixed_precision:
        return config.mixed_precision if resolved is None else (
            f"{resolved} ({config.resolved_mixed_precision_reason})")
    return f"{config.mixed_precision}: {resolved} ({config.resolved_mixed_precision_reason})"


def _read_eval(model_dir: str) -> dict:
    results = {}
    try:
        with open(os.path.join(model_dir, run_dir.EVAL_RESULTS_NAME), encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(" = ")
                if value:
                    results[key.strip()] = value.strip()
    except OSError:
        pass
    return results


def _data_section(manifest: Optional[dict]) -> str:
    if manifest is None:
        return "No dataset manifest in the run directory (imported or pre-manifest run).\n"
    train = manifest.get("splits", {}).get("train", {})
    evaluation = manifest.get("splits", {}).get("eval", {})
    rows = [("corpus", f"`{manifest.get('corpus_dir', '?')}` ({manifest.get('input_format', 'text')})"),
            ("documents (train)", f"{train.get('documents', '?'):,}" if isinstance(train.get('documents'), int) else "?"),
            ("examples train / held out", f"{train.get('examples', '?')} / {evaluation.get('examples', 0)}"),
            ("tokens (train)", f"{train.get('tokens', '?'):,}" if isinstance(train.get('tokens'), int) else "?"),
            ("max_seq_length", manifest.get("max_seq_length", "?")),
            ("lowercased / accents stripped", f"{manifest.get('do_lower_case')} / {manifest.get('strip_accents')}"),
            ("vocab", f"{manifest.get('vocab', {}).get('size', '?')} tokens, sha256 "
                      f"`{str(manifest.get('vocab', {}).get('sha256', '?'))[:16]}...`"),
            ("built with", f"`{manifest.get('command', '?')}`")]
    return _table(rows)


def _table(rows) -> str:
    return "| | |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in rows)


def model_card(part: str, architecture: str, hf_config: Mapping, loaded, model_dir: str,
               num_parameters: int, do_lower_case: bool) -> str:
    """The README.md text for one exported network.

    Args:
        part: "discriminator" or "generator".
        architecture: the transformers class ("ElectraForPreTraining", ...).
        hf_config: the written config.json fields.
        loaded: `run_dir.LoadedRun` of the exported checkpoint.
        model_dir: the run directory.
        num_parameters: parameters in the written weights.
        do_lower_case: bool. How the tokenizer normalises.
    """
    config = loaded.config
    tokenization = _tokenization(loaded, do_lower_case)
    sizes = _sizes_table(hf_config, num_parameters)
    training = _training_table(loaded)
    metrics = _metrics_section(model_dir)
    usage_class = "ElectraForPreTraining" if part == "discriminator" else "ElectraForMaskedLM"
    return f"""---
library_name: transformers
tags:
- electra
- electra-tf
---

# {config.model_name} ({part})

ELECTRA {part} pretrained with electra-tf (TensorFlow 2, faithful to the official
google-research/electra code) and exported for `transformers.{architecture}`
(`electra-convert to-hf`). {"The discriminator is the model to fine-tune; its head labels each token as original or replaced." if part == "discriminator" else "The generator is the small masked-LM that proposes replacements during pretraining."}

## Model

{sizes}
## Data

{_data_section(_read_manifest(model_dir))}
## Training

{training}
## Held-out metrics (`eval_results.txt`)

{metrics}
## Use

```python
from transformers import AutoTokenizer, {usage_class}

tokenizer = AutoTokenizer.from_pretrained("PATH")  # tokenizer.json: the fast tokenizer
model = {usage_class}.from_pretrained("PATH")
outputs = model(**tokenizer(["An example sentence."], return_tensors="pt"))
```

Tokenization: {tokenization};
`tokenizer.json` gives the same ids as electra-tf's tokenizer. The training data's licences apply
to this model.
"""


def _tokenization(loaded, do_lower_case: bool) -> str:
    """The card's tokenization line: SentencePiece or WordPiece, and how text is normalised."""
    if getattr(loaded.vocab, "kind", "wordpiece") == "sentencepiece":
        return ("SentencePiece (`spm.model`, its own normalisation), the BERT special tokens "
                "mapped to its pieces")
    return (f"BERT WordPiece, lowercasing {'on' if do_lower_case else 'off'} as the training "
            "data was built")


def _sizes_table(hf_config: Mapping, num_parameters: int) -> str:
    """The card's "Model" table: the network's sizes, from the written config.json."""
    return _table([
        ("layers", hf_config["num_hidden_layers"]), ("hidden size", hf_config["hidden_size"]),
        ("attention heads", hf_config["num_attention_heads"]),
        ("intermediate size", hf_config["intermediate_size"]),
        ("embedding size", hf_config["embedding_size"]), ("vocab size", hf_config["vocab_size"]),
        ("max positions", hf_config["max_position_embeddings"]),
        ("parameters", f"{num_parameters:,}")])


def _training_table(loaded) -> str:
    """The card's "Training" table: the run's objective and main hparams (`run_dir.LoadedRun`)."""
    config = loaded.config
    return _table([
        ("objective", "ELECTRA replaced-token detection (generator + discriminator)"
         if config.electra_objective else "masked LM only"),
        ("model_size", config.model_size), ("checkpoint step", f"{loaded.step:,} of "
                                                             f"{config.num_train_steps:,}"),
        ("train_batch_size", config.train_batch_size), ("learning_rate", config.learning_rate),
        ("optimizer", config.optimizer), ("mask_prob", config.mask_prob),
        ("generator_hidden_size", config.generator_hidden_size),
        ("disc_weight", config.disc_weight), ("mixed_precision", _precision(config)),
        ("seed", config.seed)])


def _metrics_section(model_dir: str) -> str:
    """The card's held-out metrics: the run's eval_results.txt as a table, or a note."""
    results = _read_eval(model_dir)
    return (_table(sorted(results.items())) if results else
            "Not evaluated (run with `\"do_eval\": true` to write `eval_results.txt`).\n")
