"""Small fine-tuning tasks built from real text, in the official file formats.

GLUE, SQuAD, MRQA and CoNLL-2000 cannot be fetched offline (no package ships them), so the tests
and the runs in docs/finetuning.md use tasks built from a corpus of real sentences (by default
the pretraining corpus, `pretrain_data/corpus`: one sentence per line, blank lines between
documents). The labels are synthetic but follow rules a reader can check; each task has a
trivial baseline the fine-tuned model must clearly beat.

- `sts` (regression, STS-B TSV): sentence b is the first k of the n words of sentence a; score =
  5 k / n (how much of a b covers, 0 to 5). Baseline: a constant prediction (correlation 0).
- `squadv1`, `squad` (SQuAD 1.1 / 2.0 JSON) and `newsqa` (MRQA JSON Lines): the context is 2-4
  consecutive sentences of a document holding both a year (1500-2099) and an amount (another
  whole number), the asked kind once; the question is that number's sentence with the number
  replaced by "what year" or "how many"; the answer is the number at its character offset. In
  `squad` a third of the questions are unanswerable: the question comes from another document
  and asks for a kind of number the context does not hold (it holds the other kind). Baselines:
  the first word of the context, its first sentence, its first number, and (squad) "always no
  answer".
- `chunk` (CoNLL-2000 layout "word POS chunk"): maximal runs of content words are NP chunks,
  numbers NUM chunks, function words and punctuation O (tags B-/I-, the POS column is "X").
  Baseline: the majority tag for each word form seen in training.
- `source` (a generic classification task, `text<TAB>label` TSV): which corpus a sentence comes
  from (the file name's prefix: austen, foldoc, lee, wiki). Baseline: the majority class.

    python -m electra_tf.commands.build_corpus_tasks --output-dir DIR [--num-train 2000 --num-dev 500]

writes DIR/<task>/train.* and dev.* for each task; the same arguments give the same files.
"""

from __future__ import annotations

import collections
import json
import os
import random
import re
from typing import Dict, List, Sequence, Tuple

from electra_tf.errors import ElectraError

DEFAULT_CORPUS = os.path.join("pretrain_data", "corpus")
TASKS = ("sts", "squadv1", "squad", "newsqa", "chunk", "source")
FUNCTION_WORDS = frozenset("""
a an the and or but nor so yet if then than that this these those there here of in on at by for
with from to into onto upon over under about above below after before between through during
without within against among as is are was were be been being am do does did done have has had
having will would shall should can could may might must not no it its it's he him his she her
hers they them their theirs we us our ours you your yours i me my mine who whom whose which what
when where why how all any both each few more most other some such only own same too very just
also
""".split())


class CorpusTaskError(ElectraError, ValueError):
    """The corpus cannot give the tasks asked for (an unknown task, too few usable documents)."""


_WORD = re.compile(r"^[A-Za-z]{4,}$")
_NUMBER = re.compile(r"^[0-9][0-9,.]*$")


def read_documents(corpus_dir: str, min_words: int = 6, max_words: int = 40,
                   limit: int = 20000) -> List[List[str]]:
    """Documents (lists of sentences) of `corpus_dir`'s .txt files, sentences of min..max words.

    Args:
        corpus_dir: str. One sentence per line, blank lines between documents.
        min_words, max_words: keep sentences with this many whitespace words.
        limit: stop after this many documents with at least 3 kept sentences (in total, over
            the files in name order).
    """
    documents: List[List[str]] = []
    for name in sorted(os.listdir(corpus_dir)):
        if not name.endswith(".txt"):
            continue
        documents += read_file_documents(os.path.join(corpus_dir, name), min_words, max_words,
                                         limit - len(documents))
        if len(documents) >= limit:
            break
    return documents


def read_file_documents(path: str, min_words: int, max_words: int, limit: int) -> List[List[str]]:
    """The documents of one corpus file (see `read_documents`)."""
    documents: List[List[str]] = []
    current: List[str] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in list(f) + [""]:
            line = " ".join(line.split())
            if not line:
                if len(current) >= 3:
                    documents.append(current)
                    if len(documents) >= limit:
                        return documents
                current = []
            elif min_words <= len(line.split()) <= max_words and "\t" not in line:
                current.append(line)
    return documents


def source_rows(corpus_dir: str, n: Dict[str, int], rng: random.Random, max_words: int):
    """{split: [(sentence, source)]}: equal numbers of sentences per source (the file prefix),
    train and dev from different documents."""
    by_source: Dict[str, List[List[str]]] = collections.defaultdict(list)
    for name in sorted(os.listdir(corpus_dir)):
        if name.endswith(".txt"):
            by_source[name.split("_")[0]] += read_file_documents(
                os.path.join(corpus_dir, name), 6, max_words, 2000)
    rows: Dict[str, list] = {split: [] for split in n}
    for source, documents in sorted(by_source.items()):
        documents = list(documents)
        rng.shuffle(documents)
        cut = max(1, len(documents) // 5)
        for split, docs in (("train", documents[cut:]), ("dev", documents[:cut])):
            sentences = [s for d in docs for s in d]
            rows[split] += [(s, source) for s in rng.sample(sentences, min(len(sentences),
                                                                            n[split] // len(by_source)))]
    for split in rows:
        rng.shuffle(rows[split])
    return rows


# ------------------------------------------------------------------------------------------------
# sts
# ------------------------------------------------------------------------------------------------
def sts_rows(sentences: Sequence[str], n: int, rng: random.Random) -> List[Tuple[str, str, float]]:
    """(a, b, score): b = the first k of a's n words, score = 5 k / n."""
    rows = []
    for _ in range(n):
        a = rng.choice(sentences).split()
        k = rng.randint(1, len(a))
        rows.append((" ".join(a), " ".join(a[:k]), round(5.0 * k / len(a), 3)))
    return rows


def write_sts(directory: str, rows: Dict[str, list]) -> None:
    for split, split_rows in rows.items():
        with open(os.path.join(directory, f"{split}.tsv"), "w", encoding="utf-8") as f:
            f.write("index\tgenre\tsentence1\tsentence2\tscore\n")
            for i, (a, b, score) in enumerate(split_rows):
                f.write(f"{i}\tcorpus\t{a}\t{b}\t{score:.3f}\n")


# ------------------------------------------------------------------------------------------------
# QA
# ------------------------------------------------------------------------------------------------
_YEAR = re.compile(r"^(1[5-9][0-9][0-9]|20[0-9][0-9])$")
_AMOUNT = re.compile(r"^[0-9]{1,3}(,[0-9]{3})*$")
QUESTION_WORDS = {"year": "what year", "amount": "how many"}


def numbers_of(sentence: str) -> List[Tuple[str, str, int, int]]:
    """(kind, text, word index, character offset) of the years and amounts of a sentence.

    A year is a word 1500-2099 and an amount any other whole number (commas allowed), once
    surrounding punctuation is stripped: "(1985)," gives the year "1985" at its character.
    """
    found, offset = [], 0
    for index, word in enumerate(sentence.split(" ")):
        bare = word.strip(".,;:!?()[]\"'")
        lead = word.find(bare) if bare else 0
        kind = "year" if _YEAR.match(bare) else "amount" if _AMOUNT.match(bare) else None
        if kind:
            found.append((kind, bare, index, offset + lead))
        offset += len(word) + 1
    return found


def _question(sentence: str, number: Tuple[str, str, int, int]) -> str:
    """The sentence with the number replaced by "what year" / "how many"."""
    kind, text, index, _ = number
    words = sentence.split(" ")
    words[index] = words[index].replace(text, QUESTION_WORDS[kind], 1)
    return " ".join(words)


def _windows(documents: Sequence[Sequence[str]]):
    """(answerable, one_kind, asked): windows of 2-4 consecutive sentences holding both kinds of
    number, windows holding numbers of one kind only, and {kind: [(document, sentence, number)]}.
    """
    numbers = [[numbers_of(sentence) for sentence in document] for document in documents]
    answerable, one_kind = [], []
    asked: Dict[str, list] = {kind: [] for kind in QUESTION_WORDS}
    for d, document in enumerate(documents):
        for i, found in enumerate(numbers[d]):
            for number in found:
                asked[number[0]].append((d, i, number))
        for size in (2, 3, 4):
            for first in range(len(document) - size + 1):
                kinds = collections.Counter(x[0] for row in numbers[d][first:first + size]
                                            for x in row)
                if len(kinds) == 2 and min(kinds.values()) == 1:
                    answerable.append((d, first, size))
                elif len(kinds) == 1:
                    one_kind.append((d, first, size, next(iter(kinds))))
    return answerable, one_kind, asked, numbers


def qa_paragraphs(documents: Sequence[Sequence[str]], n: int, rng: random.Random,
                  unanswerable_fraction: float, windows=None) -> List[dict]:
    """SQuAD-style paragraphs {context, qas}, one question each (module docstring).

    Args:
        windows: `_windows(documents)`, when already computed.
    """
    answerable, one_kind, asked, numbers = windows or _windows(documents)
    if not answerable or (unanswerable_fraction and not one_kind):
        raise CorpusTaskError("the corpus has too few passages holding both a year and another number")
    paragraphs = []
    while len(paragraphs) < n:
        qid = f"q{len(paragraphs)}"
        if rng.random() < unanswerable_fraction:
            d, first, size, present = rng.choice(one_kind)
            kind = next(k for k in QUESTION_WORDS if k != present)
            other, sentence_index, number = rng.choice(asked[kind])
            if other == d:
                continue
            context = " ".join(documents[d][first:first + size])
            question = _question(documents[other][sentence_index], number)
            paragraphs.append({"context": context, "qas": [{
                "id": qid, "question": question, "answers": [], "is_impossible": True}]})
            continue
        d, first, size = rng.choice(answerable)
        sentences = documents[d][first:first + size]
        context = " ".join(sentences)
        starts = [sum(len(s) + 1 for s in sentences[:i]) for i in range(size)]
        found = [(i, x) for i in range(size) for x in numbers[d][first + i]]
        kinds = collections.Counter(x[0] for _, x in found)
        i, (kind, text, index, offset) = rng.choice([(i, x) for i, x in found if kinds[x[0]] == 1])
        offset += starts[i]
        assert context[offset:offset + len(text)] == text
        paragraphs.append({"context": context, "qas": [{
            "id": qid, "question": _question(sentences[i], (kind, text, index, offset)),
            "is_impossible": False, "answers": [{"text": text, "answer_start": offset}]}]})
    return paragraphs


def write_squad(directory: str, splits: Dict[str, List[dict]], version: str) -> None:
    for split, paragraphs in splits.items():
        if version == "1.1":
            paragraphs = [{"context": p["context"], "qas": [
                {k: v for k, v in qa.items() if k not in ("is_impossible", "plausible_answers")}
                for qa in p["qas"]]} for p in paragraphs]
        data = {"version": version,
                "data": [{"title": f"corpus-{split}", "paragraphs": paragraphs}]}
        with open(os.path.join(directory, f"{split}.json"), "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False)


def write_mrqa(directory: str, splits: Dict[str, List[dict]]) -> None:
    for split, paragraphs in splits.items():
        with open(os.path.join(directory, f"{split}.jsonl"), "w", encoding="utf-8") as f:
            f.write(json.dumps({"header": {"dataset": "corpus", "split": split}}) + "\n")
            for paragraph in paragraphs:
                qas = []
                for qa in paragraph["qas"]:
                    answer = qa["answers"][0]
                    start = answer["answer_start"]
                    qas.append({"qid": qa["id"], "question": qa["question"],
                                "answers": [answer["text"]],
                                "detected_answers": [{"text": answer["text"], "char_spans": [
                                    [start, start + len(answer["text"]) - 1]]}]})
                f.write(json.dumps({"context": paragraph["context"], "qas": qas},
                                   ensure_ascii=False) + "\n")


# ------------------------------------------------------------------------------------------------
# chunk
# ------------------------------------------------------------------------------------------------
def chunk_tags(words: Sequence[str]) -> List[str]:
    """NP runs of content words, NUM runs of numbers, O for function words and punctuation."""
    tags, previous = [], "O"
    for word in words:
        bare = word.strip(".,;:!?()[]\"'")
        if bare and _NUMBER.match(bare):
            kind = "NUM"
        elif bare.isalpha() and bare.lower() not in FUNCTION_WORDS:
            kind = "NP"
        else:
            kind = "O"
        if kind == "O":
            tags.append("O")
        else:
            tags.append(("I-" if previous == kind else "B-") + kind)
        previous = kind
    return tags


def write_chunk(directory: str, splits: Dict[str, List[str]]) -> None:
    for split, sentences in splits.items():
        with open(os.path.join(directory, f"{split}.txt"), "w", encoding="utf-8") as f:
            for sentence in sentences:
                words = sentence.split()
                for word, tag in zip(words, chunk_tags(words)):
                    f.write(f"{word} X {tag}\n")
                f.write("\n")


# ------------------------------------------------------------------------------------------------
def build(output_dir: str, corpus_dir: str = DEFAULT_CORPUS, num_train: int = 2000,
          num_dev: int = 500, seed: int = 0, tasks: Sequence[str] = TASKS,
          max_words: int = 40) -> Dict[str, str]:
    """Writes the tasks; returns {task: directory}.

    Args:
        output_dir: str. Gets one sub-directory per task (the official layout, so it can be
            `raw_data_dir`).
        corpus_dir: str. Real text (see `read_documents`).
        num_train, num_dev: examples (QA: questions; chunk: sentences) per split.
        seed: int.
        tasks: subset of TASKS.
        max_words: longest sentence kept.
    """
    unknown = sorted(set(tasks) - set(TASKS))
    if unknown:
        raise CorpusTaskError(f"unknown corpus task(s) {unknown}; choose from {', '.join(TASKS)}")
    documents = read_documents(corpus_dir, max_words=max_words)
    if len(documents) < 10:
        raise CorpusTaskError(f"{corpus_dir}: only {len(documents)} documents with 3+ sentences of "
                         "6-40 words; need at least 10")
    rng = random.Random(seed)
    rng.shuffle(documents)
    cut = max(2, len(documents) // 5)  # dev questions come from documents train never sees
    parts = {"train": documents[cut:], "dev": documents[:cut]}
    sizes = {"train": num_train, "dev": num_dev}
    out = {}
    qa_windows = {}
    for task in tasks:
        directory = os.path.join(output_dir, task)
        os.makedirs(directory, exist_ok=True)
        task_rng = random.Random(f"{seed}-{task}")
        if task == "sts":
            write_sts(directory, {s: sts_rows([x for d in parts[s] for x in d], sizes[s], task_rng)
                                  for s in parts})
        elif task in ("squadv1", "squad", "newsqa"):
            fraction = 1 / 3 if task == "squad" else 0.0
            for split in parts:
                if split not in qa_windows:
                    qa_windows[split] = _windows(parts[split])
            splits = {s: qa_paragraphs(parts[s], sizes[s], task_rng, fraction, qa_windows[s])
                      for s in parts}
            if task == "newsqa":
                write_mrqa(directory, splits)
            else:
                write_squad(directory, splits, "2.0" if task == "squad" else "1.1")
        elif task == "chunk":
            write_chunk(directory, {s: task_rng.sample([x for d in parts[s] for x in d],
                                                       sizes[s]) for s in parts})
        else:
            for split, rows in source_rows(corpus_dir, sizes, task_rng, max_words).items():
                with open(os.path.join(directory, f"{split}.tsv"), "w", encoding="utf-8") as f:
                    f.write("text\tlabel\n" + "".join(f"{t}\t{l}\n" for t, l in rows))
        out[task] = directory
    return out
