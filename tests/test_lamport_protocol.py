"""The Lamport protocol constants and the one slot-index formula."""

import torch

from kernels.lamport import protocol as P


def test_constants():
    assert P.LAMPORT_GENERATIONS == 3
    assert (P.ACTIVE_STAGE, P.NEXT_STAGE) == (0, 1)
    assert P.SENTINEL_BF16 == 0x8000 and P.SENTINEL_WORD == 0x80008000
    assert P.SENTINEL_INT16 & 0xFFFF == P.SENTINEL_BF16
    assert P.VEC_BF16 * 2 == P.FRAGMENT_BYTES == 16
    # -0.0 in BF16 really is the sentinel bit pattern
    neg_zero = torch.tensor([-0.0], dtype=torch.bfloat16).view(torch.int16).item() & 0xFFFF
    assert neg_zero == P.SENTINEL_BF16


def test_slot_index_matches_a_contiguous_mailbox():
    tp, capacity, hidden = 4, 5, 24
    mailbox = torch.arange(P.LAMPORT_GENERATIONS * tp * capacity * hidden).reshape(
        P.mailbox_shape(tp, capacity, hidden))
    flat = mailbox.flatten()
    for stage in range(P.LAMPORT_GENERATIONS):
        for source in range(tp):
            for token in (0, capacity - 1):
                for column in (0, 8, hidden - 8):
                    i = P.slot_index(stage, tp, source, capacity, token, hidden, column)
                    assert flat[i] == mailbox[stage, source, token, column]


def test_slot_index_covers_each_element_once():
    tp, capacity, hidden = 2, 3, 16
    seen = {P.slot_index(s, tp, r, capacity, t, hidden, c)
            for s in range(3) for r in range(tp) for t in range(capacity) for c in range(hidden)}
    assert seen == set(range(3 * tp * capacity * hidden))


def test_error_buffer_size():
    assert P.error_buffer_words(10) == P.ERR_HEADER_WORDS + 10 * P.ERR_RECORD_WORDS
