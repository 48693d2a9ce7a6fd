"""The command-line tools, installed as console scripts and run by the top-level scripts.

| console script (pip install) | from a clone                              | module            |
|------------------------------|-------------------------------------------|-------------------|
| `electra-fetch`              | `python pretrain_data/fetch.py`           | `fetch`           |
| `electra-build-dataset`      | `python build_pretraining_dataset.py`     | `build_dataset`   |
| `electra-pretrain`           | `python run_pretraining.py`               | `pretrain`        |
| `electra-finetune`           | `python run_finetuning.py`                | `finetune`        |
| `electra-convert`            | `python -m electra_tf.convert`            | `electra_tf.convert.__main__` |
| -                            | `python -m electra_tf.commands.fetch_labelled` | `fetch_labelled` |
| -                            | `python -m electra_tf.commands.build_corpus_tasks` | `build_corpus_tasks` |

Each module has `build_parser(prog)` and `main(argv=None, prog=...)`: the scripts pass their own
`prog` (error lines start with it), so both paths run the same code. Importing a module here
imports the standard library (and numpy) only, so `--help` is fast; TensorFlow is imported after
the flags are parsed and logging is set up (`electra_tf.console`).
"""

import argparse
import textwrap


def hparams_epilog(intro: str, names, statuses: str, notes: str = "") -> str:
    """The `--help` epilog: the hparam names (wrapped) under `intro`, then `notes` (paragraphs
    about particular hparams, wrapped), then the exit statuses."""
    wrapped = "".join("\n\n" + textwrap.fill(paragraph, width=96)
                      for paragraph in notes.split("\n\n") if paragraph.strip())
    return (f"{intro}:\n" + textwrap.fill(", ".join(names), width=96, initial_indent="  ",
                                         subsequent_indent="  ")
            + wrapped + f"\n\nexit status: {statuses}")


def non_negative_int(text: str) -> int:
    """argparse `type` of a count flag: an int >= 0 (else argparse's one-line error, exit 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value
