"""Bit constants of the e2m1 -> fp16 recipe (no DSL import, so CPU tests can check them)."""

# fp16 high bytes of the e2m1 magnitudes: codes 0..3 = 0, 0.5, 1, 1.5 and 4..7 = 2, 3, 4, 6.
LUT_LO = 0x3E3C3800
LUT_HI = 0x46444240
# Output pair i = [zero, h_i, zero, h_{i+4}] from the 8 looked-up bytes {hi, lo}.
PAIR_SELECTORS = (0x4808, 0x5818, 0x6828, 0x7838)
SIGN_BITS = 0x80008000
