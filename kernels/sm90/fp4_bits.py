"""Bit constants of the e2m1 -> fp16 recipe (no DSL import, so CPU tests can check them)."""

# fp16 high bytes of the e2m1 magnitudes: codes 0..3 = 0, 0.5, 1, 1.5 and 4..7 = 2, 3, 4, 6.
LUT_LO = 0x3E3C3800
LUT_HI = 0x46444240
# Output pair i = [zero, h_i, zero, h_{i+4}] from the 8 looked-up bytes {hi, lo}.
PAIR_SELECTORS = (0x4808, 0x5818, 0x6828, 0x7838)
SIGN_BITS = 0x80008000


# K order of a 64-K step when B (weights) goes to wgmma in registers (Config.w_regs). Packed
# word j (8 e2m1, physical K 8j..8j+7) of a row yields output pairs q = 0..3 holding physical K
# (8j + q, 8j + q + 4) (see dequant.py). Pair q of word j is placed at logical K
# 32 (j // 4) + 8 q + 2 (j % 4): for the register operand that is fragment slot
# `fragment_word`, for the shared-memory operand 16-byte chunk `permuted_chunk`. These work on
# Python ints and on DSL integers alike, so CPU tests check the very formulas the kernel uses.


def fragment_word(q, rowhalf, upper):
    """Word index in a thread's wgmma A fragment (4 kb + 2 khalf + rowhalf) for output pair q
    of its packed word c (upper = 0) or c + 4 (upper = 1) of row r0 + 8 rowhalf."""
    return (2 * upper + q // 2) * 4 + (q % 2) * 2 + rowhalf


def permuted_chunk(first_word, q):
    """(16-byte chunk in the 64-K fp16 row, byte offset) for output pair q of the words
    first_word, first_word + 1, ... (at most 4, not crossing a multiple of 4)."""
    return (first_word // 4) * 4 + q, (first_word % 4) * 4
