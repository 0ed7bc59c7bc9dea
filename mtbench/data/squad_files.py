"""SQuAD v1.1 JSON files and their reading: {"data": [{"title", "paragraphs": [{"context", "qas": [{"question", "id",
"answers": [{"text", "answer_start"}]}]}]}]}.

Contexts and questions are split with our own tokenizer (words and punctuation marks, with character
offsets); the first answer's character span becomes a token span: from the token that contains
`answer_start` to the token that contains the answer's last character.
"""
from __future__ import annotations

import json
from bisect import bisect_right
from typing import List, Optional, Tuple

from mtbench.data.base import QAExample
from mtbench.data.text import tokenize
from mtbench.errors import DataError


def char_span_to_tokens(tokens: List[Tuple[str, int, int]], start: int, end: int) -> Optional[Tuple[int, int]]:
    """Token indices (first, last) covering characters [start, end), or None if no token lies in it."""
    starts = [s for _, s, _ in tokens]
    first = max(0, bisect_right(starts, start) - 1)
    if first < len(tokens) and tokens[first][2] <= start:  # start fell in the space after a token
        first += 1
    last = bisect_right(starts, end - 1) - 1
    if first >= len(tokens) or last < first:
        return None
    return first, last


def parse_squad(text: str, where: str) -> Tuple[List[QAExample], int]:
    """(examples, how many answers could not be placed in their context)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{where}: not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise DataError(f"{where}: JSON nested too deep to be SQuAD v1.1 (data -> paragraphs -> qas -> answers)") \
            from None
    examples, skipped = [], 0
    try:
        for article in doc["data"]:
            for paragraph in article["paragraphs"]:
                context = paragraph["context"]
                ctx_tokens = tokenize(context)
                words = [t for t, _, _ in ctx_tokens]
                for qa in paragraph["qas"]:
                    question = [t for t, _, _ in tokenize(qa["question"])]
                    answer = qa["answers"][0] if qa["answers"] else None
                    if answer is None:
                        skipped += 1
                        continue
                    start = answer["answer_start"]
                    if isinstance(start, bool) or not isinstance(start, int) or start < 0:
                        raise DataError(f"{where}: answer_start must be a character offset (a whole number >= 0), "
                                        f"not {str(start)[:30]!r}")
                    span = char_span_to_tokens(ctx_tokens, start, start + len(answer["text"]))
                    if span is None or context[start: start + len(answer["text"])] != answer["text"]:
                        skipped += 1
                        continue
                    examples.append(QAExample(words, question, span[0], span[1]))
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise DataError(f"{where}: not SQuAD v1.1 JSON (expected data -> paragraphs -> context + qas with "
                        f"answers[text, answer_start]; failed at {type(exc).__name__}: {exc})") from None
    return examples, skipped
