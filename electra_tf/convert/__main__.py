"""`electra-convert` (or `python -m electra_tf.convert`): convert ELECTRA checkpoints between formats.

Subcommands:
  from-google   Google's TF1 checkpoint (e.g. the released electra_small) -> a model directory
                that run_pretraining.py continues from
  to-hf         model directory -> Hugging Face transformers directory (safetensors)
  to-keras-hub  model directory -> keras-hub ElectraBackbone preset
  to-google     model directory -> Google's TF1 checkpoint (official variable names)
  to-onnx       model directory (the discriminator) or fine-tuned SavedModel -> one .onnx file

Examples:
  python -m electra_tf.convert from-google --checkpoint electra_small/electra_small \\
      --vocab-file electra_small/vocab.txt --output-dir pretrain_data/models/electra_small \\
      --hparams '{"generator_hidden_size": 1.0}'
  python -m electra_tf.convert to-hf --model-dir pretrain_data/models/electra_small --output-dir hf_small
  python -m electra_tf.convert to-hf --model-dir pretrain_data/models/electra_small \\
      --output-dir hf_small_generator --part generator
  python -m electra_tf.convert to-keras-hub --model-dir pretrain_data/models/electra_small --output-dir kh_small
  python -m electra_tf.convert to-google --model-dir pretrain_data/models/electra_small --output-dir tf1_small
  python -m electra_tf.convert to-onnx --model-dir pretrain_data/models/electra_small \\
      --output electra_small_discriminator.onnx
  python -m electra_tf.convert to-onnx --model-dir \\
      pretrain_data/models/electra_small/finetuning_models/sst_model_1 --output sst.onnx

See docs/conversion.md for the name mapping, the continued-pretraining learning rate and the
measured numerical parity.
"""

from __future__ import annotations

import argparse
import sys

from electra_tf import console  # standard library only: --help stays fast
from electra_tf.cli import run_cli

PROG = "python -m electra_tf.convert"
INSTALLED_PROG = "electra-convert"  # the console script
PARTS = ("discriminator", "generator")
DEFAULT_OPSET = 17  # electra_tf.convert.onnx_export.DEFAULT_OPSET (not imported: --help stays fast)


def _add_common_export(parser: argparse.ArgumentParser, with_part: bool) -> None:
    parser.add_argument("--model-dir", required=True,
                        help="electra-tf model directory (DATA_DIR/models/NAME: config.json, vocab.txt, "
                             "checkpoints)")
    parser.add_argument("--output-dir", required=True, help="directory to write")
    if with_part:
        parser.add_argument("--part", choices=PARTS, default="discriminator",
                            help="which network to export (default: %(default)s)")
    parser.add_argument("--checkpoint", default=None,
                        help="checkpoint prefix to read (default: the latest in --model-dir, else "
                             "its init_checkpoint/ from from-google)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the files this command writes if they exist (nothing else in "
                             "--output-dir is touched)")


def _add_from_google(sub: argparse._SubParsersAction,
                     formatter: type[argparse.HelpFormatter]) -> None:
    """Adds the from-google subcommand (import Google's TF1 checkpoint).

    Args:
        sub: the top parser's subparsers action.
        formatter: the help formatter class every subcommand shares.
    """
    p = sub.add_parser(
        "from-google", formatter_class=formatter,
        help="import Google's TF1 checkpoint into a model directory",
        description="Import an official ELECTRA TF1 checkpoint (generator, discriminator and heads; "
                    "optimizer slots skipped) into DATA_DIR/models/NAME, which run_pretraining.py "
                    "then continues from (fresh optimizer, step = the checkpoint's global_step).\n"
                    "Sizes are read from the variable shapes and checked against --model-size / "
                    "--hparams; a mismatch names the variable and both shapes. A checkpoint without "
                    "generator/* and generator_predictions/* gets a freshly initialised generator.\n\n"
                    "Continuing the released ELECTRA-Small (official README): --hparams "
                    "'{\"generator_hidden_size\": 1.0}' here, then run_pretraining.py with "
                    "num_train_steps 4010000 and learning_rate 2e-4 * (4e6 + 10000) / 10000 "
                    "(the command is printed at the end).")
    p.add_argument("--checkpoint", required=True,
                   help="checkpoint prefix (e.g. electra_small/electra_small) or its directory")
    p.add_argument("--vocab-file", required=True, help="the vocab.txt the checkpoint was trained with")
    p.add_argument("--output-dir", required=True,
                   help="model directory to create, normally DATA_DIR/models/NAME")
    p.add_argument("--hparams", default=None,
                   help="JSON object (or .json file) of hparams for the continued run; sizes given "
                        "here are checked against the checkpoint")
    p.add_argument("--model-size", choices=("small", "base", "large"), default=None,
                   help="expected model size (checked against the checkpoint; default: inferred)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a previous import in --output-dir (config.json, vocab.txt, "
                        "init_checkpoint/)")


def _add_to_hf(sub: argparse._SubParsersAction,
               formatter: type[argparse.HelpFormatter]) -> None:
    """Adds the to-hf subcommand (export to Hugging Face transformers).

    Args:
        sub: the top parser's subparsers action.
        formatter: the help formatter class every subcommand shares.
    """
    p = sub.add_parser("to-hf", formatter_class=formatter,
                       help="export to Hugging Face transformers (safetensors)",
                       description="Write one network as a transformers directory: the discriminator "
                                   "for ElectraForPreTraining / ElectraModel, the generator for "
                                   "ElectraForMaskedLM (config.json, model.safetensors, vocab.txt, "
                                   "tokenizer config for AutoTokenizer).")
    _add_common_export(p, with_part=True)


def _add_to_keras_hub(sub: argparse._SubParsersAction,
                      formatter: type[argparse.HelpFormatter]) -> None:
    """Adds the to-keras-hub subcommand (export to a keras-hub preset).

    Args:
        sub: the top parser's subparsers action.
        formatter: the help formatter class every subcommand shares.
    """
    p = sub.add_parser("to-keras-hub", formatter_class=formatter,
                       help="export to a keras-hub ElectraBackbone preset",
                       description="Write one network as a keras_hub.models.ElectraBackbone preset "
                                   "(config.json, model.weights.h5, tokenizer). ElectraBackbone uses "
                                   "the tanh-approximate GELU, so outputs differ slightly from "
                                   "ELECTRA's exact GELU (docs/conversion.md); its pooler has no "
                                   "ELECTRA counterpart and stays initialised.")
    _add_common_export(p, with_part=True)


def _add_to_google(sub: argparse._SubParsersAction,
                   formatter: type[argparse.HelpFormatter]) -> None:
    """Adds the to-google subcommand (export to Google's TF1 checkpoint).

    Args:
        sub: the top parser's subparsers action.
        formatter: the help formatter class every subcommand shares.
    """
    p = sub.add_parser("to-google", formatter_class=formatter,
                       help="export to Google's TF1 checkpoint format",
                       description="Write the whole model (generator, discriminator, heads) as a TF1 "
                                   "checkpoint with the official variable names and shapes "
                                   "(model.ckpt-STEP, checkpoint, vocab.txt), for the official code "
                                   "and every tool that reads it.")
    _add_common_export(p, with_part=False)


def _add_to_onnx(sub: argparse._SubParsersAction,
                 formatter: type[argparse.HelpFormatter]) -> None:
    """Adds the to-onnx subcommand (export a serving signature to ONNX).

    Args:
        sub: the top parser's subparsers action.
        formatter: the help formatter class every subcommand shares.
    """
    p = sub.add_parser(
        "to-onnx", formatter_class=formatter,
        help="export the discriminator or a fine-tuned model to ONNX",
        description="Write a token-id serving signature as one ONNX file (tf2onnx; needs the [onnx] "
                    "extra: pip install 'electra-tf[onnx]'). Inputs: int32 input_ids, input_mask, "
                    "segment_ids [batch, sequence] (and labeled_positions [batch, words] for "
                    "tagging), both axes dynamic; outputs named as the SavedModel's:\n"
                    "  pretraining run directory or export/discriminator/STEP: serving_default -> "
                    "replaced_probs, sequence_output\n"
                    "  fine-tuned SavedModel (<tasks>_model_<trial>): <task>_ids -> classification "
                    "probabilities, logits, label_ids, labels; regression predictions, scores; "
                    "question answering start_logits, end_logits or the beam, answerable_logit; "
                    "tagging tag_ids, tags\n"
                    "Raw-text signatures are not exported (their tokenizer is a tensorflow-text "
                    "op): tokenize with the model's vocab.txt (to-hf writes tokenizer.json). "
                    "The file computes in float32 (a SavedModel exported with export_precision "
                    "bfloat16 is refused: ONNX Runtime cannot run it) and is test-loaded in "
                    "onnxruntime before it is written. Outputs equal the SavedModel's within 1e-4 "
                    "in onnxruntime (docs/conversion.md).")
    p.add_argument("--model-dir", required=True,
                   help="a pretraining run directory (DATA_DIR/models/NAME: its discriminator from "
                        "a checkpoint), an exported discriminator SavedModel (export/discriminator: "
                        "its newest version), or a fine-tuned "
                        "model's SavedModel directory (DATA_DIR/models/NAME/finetuning_models/<tasks>_model_<trial>)")
    p.add_argument("--output", required=True, help="the .onnx file to write")
    p.add_argument("--task", default=None,
                   help="the task to export from a multi-task fine-tuned model (default: its only "
                        "task)")
    p.add_argument("--checkpoint", default=None,
                   help="for a run directory: checkpoint prefix to read (default: the latest, else "
                        "its init_checkpoint/ from from-google)")
    p.add_argument("--opset", type=int, default=DEFAULT_OPSET,
                   help="ONNX opset to write, 13 to 18 (default: %(default)s)")
    p.add_argument("--overwrite", action="store_true", help="replace --output if it exists")

def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """Builds the command-line parser: the top command and its five subcommands.

    Args:
        prog: the program name shown in usage lines (INSTALLED_PROG for the console script).

    Returns:
        The parser; its ``command`` attribute names the chosen subcommand.
    """
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=formatter,
                                     epilog="exit status: 0 done, 2 bad input (one line on stderr)")
    console.add_verbosity_flags(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # One helper per subcommand, in the order the top --help lists them (argparse keeps
    # insertion order, so reordering these calls would change the help text).
    _add_from_google(sub, formatter)
    _add_to_hf(sub, formatter)
    _add_to_keras_hub(sub, formatter)
    _add_to_google(sub, formatter)
    _add_to_onnx(sub, formatter)
    return parser


def run(args: argparse.Namespace) -> None:
    """Runs the chosen subcommand (heavy imports happen here, after argument parsing)."""
    if args.command == "from-google":
        # lazy: a subcommand's libraries (TensorFlow, keras, tf2onnx) load after the flags are read
        from electra_tf.convert.google import import_google_checkpoint

        import_google_checkpoint(args.checkpoint, args.vocab_file, args.output_dir,
                                 hparams=args.hparams, model_size=args.model_size,
                                 overwrite=args.overwrite)
    elif args.command == "to-hf":
        # lazy: a subcommand's libraries (TensorFlow, keras, tf2onnx) load after the flags are read
        from electra_tf.convert.hf import export_hf

        export_hf(args.model_dir, args.output_dir, part=args.part, checkpoint=args.checkpoint,
                  overwrite=args.overwrite)
    elif args.command == "to-keras-hub":
        # lazy: a subcommand's libraries (TensorFlow, keras, tf2onnx) load after the flags are read
        from electra_tf.convert.keras_hub import export_keras_hub

        export_keras_hub(args.model_dir, args.output_dir, part=args.part, checkpoint=args.checkpoint,
                         overwrite=args.overwrite)
    elif args.command == "to-onnx":
        # lazy: a subcommand's libraries (TensorFlow, keras, tf2onnx) load after the flags are read
        from electra_tf.convert.onnx_export import export_onnx

        export_onnx(args.model_dir, args.output, task=args.task, checkpoint=args.checkpoint,
                    opset=args.opset, overwrite=args.overwrite)
    else:
        # lazy: a subcommand's libraries (TensorFlow, keras, tf2onnx) load after the flags are read
        from electra_tf.convert.google import export_google_checkpoint

        export_google_checkpoint(args.model_dir, args.output_dir, checkpoint=args.checkpoint,
                                 overwrite=args.overwrite)


def main(argv=None, prog: str = PROG) -> int:
    args = build_parser(prog).parse_args(argv)
    console.setup(args.quiet, args.verbose)
    console.import_tensorflow()
    return run_cli(f"{prog} {args.command}", lambda: run(args))


def installed_main(argv=None) -> int:
    """The `electra-convert` console script."""
    return main(argv, INSTALLED_PROG)


if __name__ == "__main__":
    sys.exit(main())
