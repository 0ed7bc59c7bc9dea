"""The predictor's largest batch within a budget: rounds of traces (one per free core), narrowed by interpolation."""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple, Union

MAX_BATCH_LIMIT = 1 << 16  # the search's upper end
FIRST_FACTORS = (4, 16)  # side by side, the first round traces these multiples of the anchor
MAX_ROUNDS = 64  # a peak that is not monotone in the batch cannot make the search run for ever

# the peaks of several batches at once (a list in the same order); a batch that cannot be traced gives the exception
Peaks = Callable[[List[int]], List[Union[int, BaseException]]]


def largest_batch(peaks: Peaks, budget: int, anchor: int, width: int = 1,
                  limit: int = MAX_BATCH_LIMIT, guess: Optional[Tuple[int, int]] = None) -> Tuple[int, str, int]:
    """The largest batch whose predicted peak is within `budget`, to 1 %: (batch, why, rounds), a round being one
    call of `peaks`.

    Memory grows about linearly with the batch, so the line through two traces gives a guess; each later round
    traces the guess and the batch 1 % above it, so a right guess ends the search (the guess fits, the batch above
    does not). With `width` >= 2 a round's batches are asked for together (traced side by side: a CNN's answer in two
    rounds, 4 and 16 times `anchor` first); with 1, one batch at a time from `anchor` and twice it, and the batch
    above the guess only where the guess fits and no batch that does not fit is known yet. Between a batch that
    fits and one that does not, the next guess is where the line through the two ends' peaks meets the budget, with
    the Illinois rule (an end kept twice counts half its distance from the budget, so a curved peak does not make
    the line creep), or the middle where an end has no peak. Where the first batch traced fails, its exception is
    raised; a later batch that fails counts as one that does not fit.

    `guess` = (the anchor's peak, already known, and a first guess at the answer: the predictor's, from the anchor's
    breakdown into a fixed part and a part per sample): the first round traces the guess (and the batch 1 % above
    it: one at a time where the guess fits; side by side in the same round, the batch below the guess with it
    instead where the anchor is above the guess), so a model whose peak is affine in the batch is answered in about
    two traces. Where both ends known do not fit, the next guess follows the line through the two smallest downwards
    to the budget.
    """
    known: Dict[int, Optional[int]] = {}  # batch -> predicted peak (None: it could not be traced)
    # side by side, the first round is 4 and 16 times the anchor: a small batch's peak bends below the line that
    # larger ones follow (resnet50: 19.3 MiB a sample from 2 to 4, 23.7 from 8 up), so a line from there misses
    first = [f * anchor for f in FIRST_FACTORS] if width > 1 else [anchor]
    rounds = 0
    if guess is not None:
        known[anchor] = int(guess[0])
        first = [max(1, min(limit, int(guess[1])))]
        if width > 1:  # side by side, a neighbour 1 % away in the same round: a right guess ends the search
            g = first[0]
            # from an anchor above it the guess errs high (the anchor's fixed part, under-stated, leaves more to
            # each sample), so the neighbour is the batch below, whose batch 1 % above is the guess
            first = [g - max(1, g // 101), g] if anchor > g > 1 else [g, g + max(1, g // 100)]

    def ask(batches: List[int]) -> None:
        nonlocal rounds
        todo = [b for b in dict.fromkeys(batches) if b not in known and 1 <= b <= limit]
        if not todo:
            return
        rounds += 1
        for b, p in zip(todo, peaks(todo)):
            if isinstance(p, BaseException):
                if b == first[0] and guess is None:
                    raise p
                known[b] = None  # a batch the workload itself refuses (batch norm needs 2 samples): not a fit
            else:
                known[b] = int(p)

    def fits(b: int) -> bool:
        p = known.get(b)
        return p is not None and p <= budget

    ask(first)
    if guess is not None and width == 1 and fits(first[0]):
        ask([first[0] + max(1, first[0] // 100)])  # the batch above a right guess ends the search
    lo, hi = _bracket(known, budget, 0, None)  # lo fits (or is 0); hi does not (None: none found yet)
    over: Dict[int, float] = {}  # an end's distance from the budget, where Illinois halved it
    moved: Optional[bool] = None  # the end the last round moved: True lo, False hi
    for _ in range(MAX_ROUNDS):
        if (hi is not None and hi - lo <= max(1, lo // 100)) or (hi is None and lo >= limit):
            break
        x, above = _next_guess(known, budget, lo, hi, over, limit)
        if width > 1:
            ask([x] + ([above] if above else []))
        else:  # one at a time: the batch above only on the way up (narrowing, it would rarely end the search)
            ask([x])
            if above and hi is None and fits(x):
                ask([above])
        new_lo, new_hi = _bracket(known, budget, lo, hi)
        lo_moved, hi_moved = new_lo != lo, new_hi != hi
        if lo_moved != hi_moved:  # one end moved: where the same end moved twice, the kept one counts half
            kept = hi if lo_moved else lo
            if moved == lo_moved and kept and known.get(kept) is not None:
                over[kept] = over.get(kept, float(known[kept] - budget)) / 2  # type: ignore[operator]
            moved = lo_moved
        else:
            moved = None
        lo, hi = new_lo, new_hi
    if lo == 0:
        return 0, f"no batch fits the budget (batch {hi} does not)", rounds
    if hi is None:
        return lo, f"fits up to the search limit {limit}", rounds
    why = f"{known[hi]} > {budget} bytes" if known.get(hi) is not None else "it could not be traced"
    return lo, f"batch {hi} does not fit: {why}", rounds


def _bracket(known: Dict[int, Optional[int]], budget: int, lo: int, hi: Optional[int]) -> Tuple[int, Optional[int]]:
    """The bracket narrowed by what is known: the largest batch above `lo` that fits, below the first that does not."""
    for b in sorted(known):
        if lo < b and (hi is None or b < hi):
            p = known[b]
            if p is not None and p <= budget:
                lo = b
            else:
                return lo, b
    return lo, hi


def _next_guess(known: Dict[int, Optional[int]], budget: int, lo: int, hi: Optional[int],
                over: Dict[int, float], limit: int) -> Tuple[int, Optional[int]]:
    """The next batch to trace and the one 1 % above it (None where that says nothing new)."""
    if hi is None:  # upwards from lo: the line through the two largest batches that fit, or double
        fitting = sorted(b for b, p in known.items() if p is not None and p <= budget and b <= lo)
        if len(fitting) < 2:
            return min(limit, 2 * lo), None  # a line needs two points: double first
        b2 = fitting[-1]  # and one at least an eighth below it (the two batches of a round are 1 % apart)
        b1 = max([b for b in fitting if b <= b2 - max(1, b2 // 8)], default=fitting[-2])
        p1, p2 = known[b1], known[b2]
        per_sample = max((p2 - p1) / (b2 - b1), 1.0)  # type: ignore[operator]
        x = b2 + int((budget - p2) / per_sample)  # type: ignore[operator]
        x = min(limit, max(x, lo + 1) if x > lo else lo + max(1, lo // 8))
    else:
        x = (lo + hi) // 2
        f_lo, f_hi = (over.get(b, None if known.get(b) is None else float(known[b] - budget))  # type: ignore
                      for b in (lo, hi))
        if f_lo is not None and f_hi is not None and f_hi > f_lo:
            x = min(hi - 1, max(lo + 1, lo + int(-f_lo * (hi - lo) / (f_hi - f_lo))))
        elif f_hi is not None:  # no fitting end with a peak: down the line through the two smallest that do not
            above = sorted(b for b, p in known.items() if b > hi and p is not None)
            if above:
                slope = (known[above[0]] - known[hi]) / (above[0] - hi)  # type: ignore[operator]
                if slope > 0:
                    x = min(hi - 1, max(lo + 1, hi - int(-(-f_hi // slope))))
    above = x + max(1, x // 100)
    if above > limit or (hi is not None and above >= hi):
        return x, None
    return x, above
