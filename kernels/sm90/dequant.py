"""NVFP4 -> fp16 conversion in registers for the Hopper kernel (device code helpers).

One recipe (dequant_word_w, the shift form of fp4_bits) for both operands: the weights into
wgmma register fragments (weights.py), the activations into fp16 rows in shared or global
memory, a lane's half of a 64-K step at a time (load_half_step, half_step_vectors). Each value
leaves it as value * scale * 2^-7, so every product carries 2^-14, which the epilogue undoes
(fp4_bits.ACC_UNSCALE).

One 32-bit word holds 8 e2m1 codes n0..n7 (n_i in bits 4i..4i+3, element 2j in the low nibble).
It becomes 4 fp16x2 words holding the pairs (n0, n4), (n1, n5), (n2, n6), (n3, n7): the K order
inside each group of 8 is permuted, which is harmless because BOTH operands get this same pair
order, so every product still pairs the same k of A and B, and the 8 values share one scale.
Every step is exact, so HMUL2 rounds nothing (fp4_bits.W_SCALE_EXP's comment).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import cutlass.cute as cute
from cutlass import Uint32

from .fp4_bits import W_MAG_BITS, W_PAIRS, W_SCALE_F16X2, W_SIGNS
from .ptx import (
    e4m3x2_to_f16x2,
    ld_global_nc_u32,
    mul_f16x2,
    mul_f16x2_by_half,
    prmt,
    select_bits,
    shl,
)
from .staging import half_step_addresses


def word_sources(w: Any) -> tuple[Uint32, Uint32]:
    """The two byte words dequant_word_w's pairs are permuted from: byte j of the first is the
    fp16 high byte of n_2j (magnitude from w << 1, sign from bit 8j+3), of the second n_2j+1's.
    6 instructions: 3 LOP3, 3 shifts."""
    w = Uint32(w)
    signs = w & Uint32(W_SIGNS)
    even = select_bits(w << Uint32(1), shl(signs, 4), Uint32(W_MAG_BITS))
    odd = select_bits(w >> Uint32(3), signs, Uint32(W_MAG_BITS))
    return even, odd


def source_pair(sources: tuple, q: int, scales: Any, half: int) -> Uint32:
    """Output pair q of a word_sources pair, times half `half` of a scales_w word: one PRMT
    and one HMUL2 (the scale's splat folded into the operand)."""
    src, sel = W_PAIRS[q]
    return mul_f16x2_by_half(prmt(sources[src], Uint32(0), Uint32(sel)), scales, half)


def dequant_word_w(w: Any, scales: Any, half: int) -> list[Uint32]:
    """8 e2m1 codes times half `half` of a `scales_w` word -> 4 fp16x2 words, pairs (n0, n4),
    (n1, n5), (n2, n6), (n3, n7), each value * scale * 2^(W_SCALE_EXP - 14). 14 instructions
    per word: 3 LOP3, 3 shifts, 4 PRMT, 4 HMUL2."""
    sources = word_sources(w)
    return [source_pair(sources, q, scales, half) for q in range(4)]


def scales_w(two_scale_bytes: Any) -> Uint32:
    """Two e4m3 scales (low 16 bits) -> fp16x2, each times 2^W_SCALE_EXP (exact: 448 * 128 <
    65504), for dequant_word_w's `scales` (which picks one half)."""
    return mul_f16x2(e4m3x2_to_f16x2(two_scale_bytes), Uint32(W_SCALE_F16X2))


def load_half_step(step: Any, scale_word: Any, parity: Any) -> tuple:
    """A lane's half of a 64-K step of one A row (staging.half_step_addresses): its 4 packed
    words at positions 0..3 and the step's 4 scale bytes as one word, from the step's packed
    address and its scale word's address."""
    base, offsets = half_step_addresses(step, parity)
    return [ld_global_nc_u32(base, off) for off in offsets], ld_global_nc_u32(scale_word)


def exchange_half_step(words: Any, two_scales: Any, parity: Any) -> tuple[list, Uint32]:
    """Phase 1's lanes 2i and 2i + 1 hold the two 32-K chunks of one 64-K step of a row (each
    its 4 packed words and 2 scales, one 16-byte and one 2-byte load): swap half the words
    with the partner so each holds the words of its parity p at positions 0..3
    (fp4_bits.position_word) and all 4 scales of the step, as load_half_step would have read
    them. Three shuffles and 10 LOP3 / PRMT instead of load_half_step's 5 loads per chunk
    (with those, Mixtral down's prefill, whose phase 1 streams 4096 x 8 rows of K 14336, ran
    1.5-2.9% slower; with the swap 1.4% faster: docs/lab_notebook.md, thirty-fourth session).
    The whole warp takes part."""
    odd = Uint32(0) - Uint32(parity)  # all ones on the odd lane
    # The even lane sends its words 1 and 3 (the odd lane's positions 0, 1), the odd lane its
    # words 0 and 2 (the even lane's positions 2, 3); each keeps the other two.
    send = [select_bits(words[0], words[1], odd), select_bits(words[2], words[3], odd)]
    keep = [select_bits(words[1], words[0], odd), select_bits(words[3], words[2], odd)]
    got = [cute.arch.shuffle_sync_bfly(x, 1) for x in send]
    positions = [select_bits(got[0], keep[0], odd), select_bits(got[1], keep[1], odd),
                 select_bits(keep[0], got[0], odd), select_bits(keep[1], got[1], odd)]
    other = cute.arch.shuffle_sync_bfly(two_scales, 1)
    # The even chunk's two scales first: (own, partner's) on the even lane, swapped on the odd.
    order = select_bits(Uint32(0x1054), Uint32(0x5410), odd)
    return positions, prmt(two_scales, other, order)


def half_step_vectors(words: Any, four_scale_bytes: Any) -> Callable[[int], list[Uint32]]:
    """A lane's 4 words (load_half_step) -> vector(q): pair q of positions 0..3, the 16 fp16
    bytes of the lane's vector q (fp4_bits.position_vector). Position i lies in 16-K block i,
    so it takes scale byte i. Each vector is built when asked for, so a caller may store one
    before building the next."""
    low = scales_w(four_scale_bytes)
    high = scales_w(Uint32(four_scale_bytes) >> Uint32(16))
    sources = [word_sources(w) for w in words]
    return lambda q: [source_pair(sources[i], q, (low, high)[i // 2], i % 2) for i in range(4)]
