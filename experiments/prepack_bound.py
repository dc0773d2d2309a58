"""Would a prepacked weight layout make the e2m1 -> fp16 conversion cheaper? (CPU only.)

The recipe (kernels/sm90/dequant.py) spends 14 instructions per 8 weights: 6 to build the fp16
high bytes (sign at bit 7, magnitude at bits 3..1), 4 PRMT to place them as fp16x2 pairs and 4
HMUL2 for the block scale. It is 56 of a decode step's ~100 instructions per warp, and the
H200's decode is bound by that step rate (bench/RESULTS.md, "What bounds decode").

An engine could repack its weights once at load (as Marlin does), so the cheapest conceivable
layout is one where every fp16x2 pair is one shift of the stored word and one mask (LOP3):
its 8 bits must sit at T = {9, 10, 11, 15, 25, 26, 27, 31} after the shift (sign at 15,
magnitude at 11..9, both halves), so four (or, over two words, eight) shifted copies of T must
tile the stored bits exactly. This script searches every shift, plain, rotating and funnel over
two words, and finds no tiling. That ideal layout would cost 3 shifts + 4 masks + 4 HMUL2 = 11
per 8 weights (one pair unshifted); it does not exist, so a repack saves fewer than 3 of the 14
(fewer than 12 of a step's ~100 instructions per warp): not worth a second weight format in the
API. Run: python experiments/prepack_bound.py
"""

from __future__ import annotations

import itertools

T = (9, 10, 11, 15, 25, 26, 27, 31)  # one fp16x2 pair's sign and magnitude bits


def word_tilings(rotate: bool) -> list[tuple[int, ...]]:
    """Four shifts whose shifted copies of T cover the 32 bits of one word exactly."""
    found = []
    shifts = range(32) if rotate else range(-31, 32)
    for chosen in itertools.combinations(shifts, 4):
        bits = [(t + s) % 32 if rotate else t + s for s in chosen for t in T]
        if all(0 <= b < 32 for b in bits) and len(set(bits)) == 32:
            found.append(chosen)
    return found


def funnel_tilings() -> list[tuple[int, ...]]:
    """Eight shifts of a 64-bit word pair (SHF funnel) whose copies of T cover its 64 bits."""
    shifts = [s for s in range(-9, 33) if all(0 <= t + s < 64 for t in T)]
    masks = {s: sum(1 << (t + s) for t in T) for s in shifts}
    full, found = (1 << 64) - 1, []

    def extend(covered: int, chosen: list[int]) -> None:
        if covered == full:
            found.append(tuple(chosen))
            return
        low = (~covered & (covered + 1)).bit_length() - 1  # lowest bit still uncovered
        for s in shifts:
            m = masks[s]
            if (m >> low) & 1 and not m & covered and not m & ((1 << low) - 1):
                extend(covered | m, chosen + [s])

    extend(0, [])
    return found


if __name__ == "__main__":
    for name, tilings in (("shifts of one word", word_tilings(False)),
                          ("rotations of one word", word_tilings(True)),
                          ("funnel shifts of two words", funnel_tilings())):
        print(f"{name}: {len(tilings)} tilings" + (f", e.g. {tilings[0]}" if tilings else ""))
