"""Bit constants of the e2m1 -> fp16 recipe (no DSL import, so CPU tests can check them)."""

# The recipe (dequant.dequant_word_w, both operands), shift form: an e2m1 code s e1 e0 m
# becomes the fp16 high byte s000 e1 e0 m0, i.e. the fp16 value * 2^-14 (exact, subnormal for
# e = 0). Two LOP3 build those bytes for the even codes (n0, n2, n4, n6) and the odd codes of a
# word, each taking bits 1..3 of each byte from a shifted copy of the word and bit 7 from the
# sign bits W_SIGNS; a PRMT against zero then places two bytes as one fp16x2 pair.
W_SIGNS = 0x88888888
W_MAG_BITS = 0x0E0E0E0E
W_PAIR_SELECTORS = (0x2404, 0x3414)  # bytes 0, 2 and bytes 1, 3 as the high bytes of a pair
# Output pair q (n_q, n_{q+4}) of a word = (source, selector): source 0 holds the even codes
# (n0, n2, n4, n6 in bytes 0..3), source 1 the odd codes: pairs (n0, n4), (n1, n5), (n2, n6),
# (n3, n7).
W_PAIRS = ((0, W_PAIR_SELECTORS[0]), (1, W_PAIR_SELECTORS[0]),
           (0, W_PAIR_SELECTORS[1]), (1, W_PAIR_SELECTORS[1]))
# The block scale is multiplied by 2^W_SCALE_EXP before the HMUL2 (448 * 2^7 still fits fp16),
# so a weight leaves the recipe as value * scale * 2^(W_SCALE_EXP - 14); the epilogue multiplies
# the fp32 accumulator by 2^(14 - W_SCALE_EXP). Every step is a power-of-two scaling of an exact
# value: value * scale * 2^-7 lies in [2^-17, 21] with at most 6 significant bits, which fp16
# (subnormals down to 2^-24) holds exactly.
W_SCALE_EXP = 7
W_UNSCALE = float(2 ** (14 - W_SCALE_EXP))
W_SCALE_F16X2 = 0x00010001 * ((15 + W_SCALE_EXP) << 10)  # fp16 2^W_SCALE_EXP in both halves
# Both operands (weights and activations) go through the recipe, so every product is scaled by
# W_UNSCALE^-2 = 2^-14 and the epilogue multiplies the fp32 accumulator by ACC_UNSCALE. Products
# lie in [2^-34, 441] with at most 10 significant bits: fp32 sums of them are as exact as the
# unscaled sums (a power-of-two factor, far from fp32's subnormals), and so is the unscaling.
ACC_UNSCALE = W_UNSCALE * W_UNSCALE


# K order of a 64-K step (weights.py for B in registers, dequant.py's half steps for A in
# shared memory). Packed word j (8 e2m1, physical K 8j..8j+7) of a row yields output pairs q =
# 0..3 holding physical K (8j + q, 8j + q + 4) (see dequant.py). Pair q of word j is placed at
# logical K 32 (j % 2) + 8 q + 2 (j // 2). So weight thread c (lane % 4) reads words 2c and
# 2c + 1, packed bytes 8c..8c+7 of the step: one 8-byte load of one 16-K scale block. On the A
# side a lane of parity p converts the words p, p + 2, p + 4, p + 6 (its "positions" 0..3, in
# 16-K blocks 0..3), which fill the 64 fp16 bytes of vectors 4p..4p+3 of the row's step. These
# work on Python ints and on DSL integers alike, so CPU tests check the very formulas the
# kernel uses.


def fragment_word(q, rowhalf, upper):
    """Word index in a thread's wgmma A fragment (4 kb + 2 khalf + rowhalf) for output pair q
    of its packed word 2c (upper = 0) or 2c + 1 (upper = 1) of row r0 + 8 rowhalf."""
    return (2 * upper + q // 2) * 4 + (q % 2) * 2 + rowhalf


def thread_step_bytes(s, c):
    """(16-byte chunk of the 128-byte packed row, byte offset in it) of the 8 bytes (words 2c
    and 2c + 1) that weight thread c reads in 64-K sub-step s, before the swizzle."""
    return 2 * s + c // 2, 8 * (c % 2)


def position_word(p, i):
    """The packed word (of the 8 in a 64-K step) at position i of a lane of parity p."""
    return p + 2 * i


def position_vector(p, q):
    """The 16-byte fp16 vector (of the 8 in a 64-K step's row) that pair q of a lane of parity
    p fills; position i's pair lands at byte 4 i of it."""
    return 4 * p + q
