"""Read an adapter's weights from disk straight into its staged pages: no buffer in between.

A load from disk reads the file, checks it and stages it (page_layout.stage_adapter). When the
file stores the model's dtype, the staging is only a copy, and every piece of a tensor that
lands in one page is a contiguous run of the tensor's bytes (page_layout.page_chunks) that
starts at the page's first element. So the file can be read into the pages themselves: one
`preadv` per tensor, its buffers the pieces of the tensor's pages. That drops the read buffer's
second pass over the data, and the ~900 small tensor copies of staging, each of which needs the
interpreter back from the engine's thread.

    tensor bytes  [ piece 0 | piece 1 | ... ]     (consecutive in the file)
    pages         page f + p0: piece 0, then zeros; page f + p1: piece 1, then zeros; ...
"""

from __future__ import annotations

import os

import torch

from loraplex.engine.errors import InvalidAdapterError
from loraplex.engine.lora.adapter import DTYPES, AdapterFileHeader, file_id
from loraplex.engine.lora.page_layout import SLICES, AdapterPageLayout, page_chunks


def read_staged(header: AdapterFileHeader, layout: AdapterPageLayout, pages: torch.Tensor) -> None:
    """Read the adapter's tensors into `pages` ([layout.num_pages, num_layers, page_size],
    contiguous, in the file's dtype: a run of HostPagePool.run_pages), staged as
    page_layout.stage_adapter stages them, every other element zero. Raises
    InvalidAdapterError if the file changed since its header was read."""
    num_pages, num_layers, page_size = pages.shape
    assert pages.is_contiguous() and num_pages == layout.num_pages
    itemsize = pages.element_size()
    raw = pages.view(torch.uint8).numpy()  # [P, L, page_size * itemsize], shares memory
    filled = [0] * num_pages  # elements read into each page (the same in every layer)
    # (file offset, layer, first page, the pieces) of every tensor
    reads: list[tuple[int, int, int, list[tuple[int, int]]]] = []
    for i, module in enumerate(SLICES):
        if layout.first_a[i] < 0:
            continue
        in_dim = header.tensors[header.index[(0, module, "A")]].shape[1]
        sides = (
            ("A", layout.first_a[i], page_chunks(layout.rank, in_dim, page_size)),
            ("B", layout.first_b[i], page_chunks(1, layout.out_dims[i] * layout.rank, page_size)),
        )
        for side, first, chunks in sides:
            for page, count in chunks:
                filled[first + page] = count
            for layer in range(num_layers):
                tensor = header.tensors[header.index[(layer, module, side)]]
                assert pages.dtype == DTYPES[tensor.dtype], "read only in the file's dtype"
                reads.append((header.data_start + tensor.begin, layer, first, chunks))
    reads.sort(key=lambda read: read[0])  # the file front to back
    with header.weights_file.open("rb", buffering=0) as f:
        if file_id(f) != header.file_id:
            raise InvalidAdapterError("adapter file changed while it was being loaded")
        # Each tensor's buffers are made just before its read: the engine's thread waits for
        # the interpreter while this one runs Python, so no long stretch of it at once.
        for offset, layer, first, chunks in reads:
            buffers = [raw[first + page, layer, : count * itemsize].data for page, count in chunks]
            _preadv_all(f.fileno(), buffers, offset)
    for page, count in enumerate(filled):
        if count < page_size:
            raw[page, :, count * itemsize :] = 0


def _preadv_all(fd: int, buffers: list[memoryview], offset: int) -> None:
    """Fill every buffer from the file at `offset` on (a read may return less than asked)."""
    while buffers:
        num_read = os.preadv(fd, buffers, offset)
        if num_read == 0:
            raise InvalidAdapterError("adapter file is shorter than its header says")
        offset += num_read
        while buffers and num_read >= len(buffers[0]):
            num_read -= len(buffers[0])
            buffers = buffers[1:]
        if buffers and num_read:
            buffers = [buffers[0][num_read:], *buffers[1:]]
