"""Fine-tune a pretrained ELECTRA discriminator on the official tasks (official flags).

Tasks (docs/finetuning.md): GLUE classification (cola, sst, mrpc, qqp, mnli, qnli, rte) and
generic TSV/CSV classification tasks; STS-B regression (sts); question answering: SQuAD 2.0
(squad), SQuAD 1.1 (squadv1) and MRQA (newsqa, naturalqs, triviaqa, searchqa); chunking (chunk);
and NER (ner) and POS tagging (pos) on any CoNLL-style files in RAW_DATA_DIR/{ner,pos}/.
Reads DATA_DIR/finetuning_data/<task>/, starts from DATA_DIR/models/MODEL_NAME (or the
`init_checkpoint` hparam: a model directory, a checkpoint prefix or an exported SavedModel), and
writes DATA_DIR/models/MODEL_NAME/results/<tasks>_results.{json,txt} (QA predictions in
results/<tasks>_qa/) and the fine-tuned SavedModels (raw-text signatures) to
.../finetuning_models/<tasks>_model_<trial>.

Examples:
  electra-finetune --data-dir pretrain_data --model-name electra_small \\
      --hparams '{"task_names": ["sst"]}'
  electra-finetune --model-name electra_small --hparams '{"task_names": ["squad"]}'
  electra-finetune --model-name electra_small \\
      --hparams '{"task_names": ["chunk"], "num_trials": 3, "layerwise_lr_decay_fix": true}'
  electra-finetune --hparams '{"task_names": ["sts"], "init_checkpoint": "DIR/export/discriminator"}'
  electra-finetune --model-name electra_small \\
      --hparams '{"task_names": ["ner"], "raw_data_dir": "DIR", "tagging_scheme": "BIOES"}'
  electra-finetune --backend jax --model-name electra_small --hparams '{"task_names": ["sst"]}'
  electra-finetune --backend torch --model-name electra_small --hparams '{"task_names": ["chunk"]}'
  electra-finetune --export-weights DIR/finetuning_models/chunk_model_1/weights.npz
"""

from __future__ import annotations

import argparse
import sys

from electra_tf import console
from electra_tf.cli import run_cli
from electra_tf.commands import hparams_epilog
from electra_tf.finetuning.config import HPARAM_NAMES, FinetuningConfig
from electra_tf.config.hparams import parse_hparams
from electra_tf.precision import AUTO_HELP
from electra_tf.sentencepiece_vocab import SENTENCEPIECE
from electra_tf.vocab import VocabError, load_vocab

PROG = "electra-finetune"
TAGGING_HELP = (
    "ner and pos read RAW_DATA_DIR/<task>/{train,dev,test}.txt (or .conll; test optional): one "
    "word per line, whitespace-separated fields, blank lines between sentences. "
    "tagging_label_column: the tag's field, 0-based, negative from the end (default -1, the "
    "last). tagging_scheme (ner): BIO (default) or BIOES; other tags are an error naming the "
    "line. tagging_entity_mode (ner): default or strict, the seqeval 1.2.2 mode the entity "
    "precision / recall / f1 equal. Labels come from the train file; a dev/test label not in it "
    "is an error naming file:line. pos reports accuracy. Serving takes raw text and returns "
    "words and (ner) entities with character offsets (docs/finetuning.md).")


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    epilog = hparams_epilog(
        "hparams (official configure_finetuning.py names plus electra-tf additions; see "
        "docs/finetuning.md; an unknown key is an error)", HPARAM_NAMES,
        "0 done, 2 bad input (one line on stderr), 130 interrupted.",
        AUTO_HELP + "\n\n" + TAGGING_HELP)
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.replace("electra-finetune", prog),
                                     epilog=epilog,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="pretrain_data",
                        help="directory with models/ and finetuning_data/ (default: %(default)s)")
    parser.add_argument("--model-name", default="electra_small",
                        help="the pretrained run, DATA_DIR/models/MODEL_NAME (default: %(default)s)")
    parser.add_argument("--hparams", default=None,
                        help="JSON object of hparams, or the path of a .json file holding one")
    parser.add_argument("--spm-model", metavar="FILE",
                        help="the SentencePiece model (.model) the pretrained model was trained "
                        "with, instead of a WordPiece vocab (the vocab_file hparam): checked "
                        "against the starting point's; with random_init, the vocabulary. The "
                        "fine-tuned SavedModels tokenise raw text with it in-graph")
    parser.add_argument("--backend", choices=console.KERAS_BACKENDS,
                        default="tensorflow",
                        help="the Keras backend to fine-tune with: tensorflow (the default; every "
                        "family, SavedModel export), jax or torch (no TensorFlow needed: every "
                        "family too; starts from a run of "
                        "any backend, a TensorFlow one only where TensorFlow is installed too; "
                        "checkpoints every save_checkpoints_steps steps, resumed by a rerun; "
                        "saves the fine-tuned weights, <tasks>_model_<trial>/weights.npz, not a "
                        "SavedModel; docs/finetuning.md, Fine-tuning on JAX and PyTorch)")
    parser.add_argument("--export-weights", metavar="WEIGHTS_NPZ",
                        help="instead of fine-tuning: export a --backend jax/torch trial's "
                        "<tasks>_model_<trial>/weights.npz as the SavedModel the TensorFlow "
                        "runner writes (raw-text signatures), to saved_model/ beside it; needs "
                        "TensorFlow and the trial's task files")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace existing results and fine-tuned models of these tasks")
    console.add_verbosity_flags(parser)
    return parser


def with_spm_model(hparams, spm_model):
    """The --hparams with --spm-model as their vocab_file (a SentencePiece model, checked)."""
    if spm_model is None:
        return hparams
    values = parse_hparams(hparams)
    if values.get("vocab_file") is not None:
        raise VocabError("--spm-model and the vocab_file hparam exclude each other: give one")
    if load_vocab(spm_model).kind != SENTENCEPIECE:
        raise VocabError(f"--spm-model {spm_model} is not a SentencePiece model (a WordPiece "
                         "vocab.txt goes to the vocab_file hparam)")
    return dict(values, vocab_file=spm_model)


def main(argv=None, prog: str = PROG) -> int:
    args = build_parser(prog).parse_args(argv)
    console.setup(args.quiet, args.verbose)
    console.use_backend(args.backend, command_line=argv is None)

    def work():
        # lazy: after KERAS_BACKEND is set above (keras reads it once, at import)
        from electra_tf.finetuning.runner import export_weights, run

        if args.export_weights:
            print(f"model: {export_weights(args.export_weights)}")
            return
        config = FinetuningConfig.create(args.model_name, args.data_dir,
                                         with_spm_model(args.hparams, args.spm_model))
        results = run(config, overwrite=args.overwrite)
        print(f"results: {config.results_json}")
        for trial in results["trials"]:
            if "export" in trial:
                print(f"model (trial {trial['trial']}): {trial['export']}")

    return run_cli(prog, work)


if __name__ == "__main__":
    sys.exit(main())
