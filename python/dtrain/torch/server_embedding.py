"""``ServerEmbedding``: an embedding table that lives on a dist store's servers. A worker holds only
the rows of the batch in flight: ``forward(ids)`` pulls them (``row_sparse_pull``'s wire form,
only those rows travel), and backward pushes their gradient back as rows, which the servers'
optimizer applies to those rows only (MXNet's ``lazy_update``; ``lazy_update=0`` in the
optimizer gives the dense formula). So a table larger than any worker's memory trains, with the
results of the same table held whole and updated by the same optimizer on the servers.

    kv = dtrain.kv.create("dist_sync")
    emb = dtrain.torch.ServerEmbedding(10_000_000, 64, kv, name="user")   # 2.4 GB, on the servers
    trainer = dtrain.torch.Trainer(mlp, "sgd", {"learning_rate": 0.1}, kvstore=kv)
    for ids, y in batches:
        loss = loss_fn(mlp(emb(ids)), y)
        loss.backward()          # the MLP's gradients, and the embedding's rows pushed
        trainer.step(batch_size)

With ``mode="sum"`` or ``"mean"`` it is an ``EmbeddingBag``: ``forward(ids, offsets)``.
``prefetch(next_ids)`` asks for the next batch's rows as soon as this step's push is in (a
dist_sync pull waits for the round its push joined), so that they arrive while the rest of the
step runs; ``forward`` then takes them.

The table is cut into shards (keys ``NAME.0``, ``NAME.1``, ... of at most ``shard_rows`` rows),
each initialised by rank 0 one at a time: no process ever holds the whole table. Rows start from
``normal(0, init_std)`` drawn from ``torch.Generator().manual_seed(seed + shard)``, the same on
every run. Every worker must create the same ServerEmbeddings in the same order (as any key), and
push every step (a dist_sync round needs every worker): each backward pushes to every shard,
empty where the batch has no row.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .. import kv as _kv

__all__ = ["ServerEmbedding"]

_SHARD_BYTES = 64 << 20  # each shard's init is one message of at most this much


class ServerEmbedding(torch.nn.Module):
    """See the module's docstring."""

    def __init__(self, num_embeddings: int, embedding_dim: int, kv: _kv.KVStore,
                 name: str = "embedding", mode: str | None = None, init_std: float = 0.01,
                 seed: int = 0, shard_rows: int | None = None,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        if not kv.type.startswith("dist"):
            raise ValueError("ServerEmbedding keeps its table on a dist store's servers; %r is a "
                             "%s store (use nn.Embedding there)" % (name, kv.type))
        if mode not in (None, "sum", "mean"):
            raise ValueError("mode must be None (an Embedding), 'sum' or 'mean' (an "
                             "EmbeddingBag), not %r" % (mode,))
        if num_embeddings < 1 or embedding_dim < 1:
            raise ValueError("a table of %d x %d" % (num_embeddings, embedding_dim))
        self.num_embeddings, self.embedding_dim, self.mode = num_embeddings, embedding_dim, mode
        self.kv, self.name, self.dtype = kv, name, dtype
        row_bytes = embedding_dim * torch.tensor([], dtype=dtype).element_size()
        self.shard_rows = shard_rows or max(1, _SHARD_BYTES // row_bytes)
        self.keys = ["%s.%d" % (name, i)
                     for i in range((num_embeddings + self.shard_rows - 1) // self.shard_rows)]
        for i, key in enumerate(self.keys):
            rows = min(self.shard_rows, num_embeddings - i * self.shard_rows)
            if kv.rank == 0:
                gen = torch.Generator().manual_seed(seed + i)
                shard = torch.randn(rows, embedding_dim, generator=gen).mul_(init_std).to(dtype)
            else:
                shard = torch.empty(rows, embedding_dim, dtype=dtype)  # only rank 0's is kept
            kv.init(key, shard)
            del shard
        self._prefetch: tuple[torch.Tensor, Any] | None = None  # (ids, pulled rows) in flight
        self._next_ids: torch.Tensor | None = None  # prefetch()'s, until this step's push
        self._awaiting_push = False  # a forward's rows wait for their backward

    def extra_repr(self) -> str:
        return "%d, %d, name=%r, shards=%d%s" % (
            self.num_embeddings, self.embedding_dim, self.name, len(self.keys),
            ", mode=%r" % self.mode if self.mode else "")

    # --- rows on the wire ---
    def _by_shard(self, ids: torch.Tensor) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
        """(shard, positions in `ids`, the shard's row numbers) for every shard, in order."""
        shard_of = torch.div(ids, self.shard_rows, rounding_mode="floor")
        parts = []
        for s in range(len(self.keys)):
            where = (shard_of == s).nonzero().reshape(-1)
            parts.append((s, where, ids[where] - s * self.shard_rows))
        return parts

    def _pull(self, unique: torch.Tensor) -> tuple[torch.Tensor, list[Any]]:
        """The rows `unique` (sorted, distinct), and the calls that write them."""
        rows = torch.empty(unique.numel(), self.embedding_dim, dtype=self.dtype)
        ops, parts = [], []
        for s, where, local in self._by_shard(unique):
            if where.numel():
                part = torch.empty(where.numel(), self.embedding_dim, dtype=self.dtype)
                ops.append(self.kv._h.pull_rows(self.keys[s], local, part, 0))
                parts.append((where, part))
        return rows, [ops, parts]

    @staticmethod
    def _gather(rows: torch.Tensor, pending: list[Any]) -> torch.Tensor:
        ops, parts = pending
        for op in ops:
            op.wait()
        for where, part in parts:
            rows.index_copy_(0, where, part)
        return rows

    def _push(self, unique: torch.Tensor, grad: torch.Tensor) -> None:
        grad = grad.to(self.dtype).contiguous()
        for s, where, local in self._by_shard(unique):
            self.kv._h.push_rows(self.keys[s], local, grad.index_select(0, where), 0)
        if self._next_ids is not None:  # the next batch's rows, once this step's push is in
            self._start_prefetch(self._next_ids)
            self._next_ids = None

    def _start_prefetch(self, ids: torch.Tensor) -> None:
        unique = torch.unique(ids)
        self._prefetch = (unique, self._pull(unique))

    def prefetch(self, ids: torch.Tensor) -> None:
        """The rows of the next batch's `ids`: asked for right after this step's push (now, if
        it is in), so that ``forward(ids)`` finds them arrived."""
        ids = self._checked(ids)
        if torch.is_grad_enabled() and self._awaiting_push:
            self._next_ids = ids
        else:
            self._start_prefetch(ids)

    def _checked(self, ids: torch.Tensor) -> torch.Tensor:
        if not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.is_complex():
            raise TypeError("ServerEmbedding %r takes integer ids" % (self.name,))
        ids = ids.to("cpu", torch.int64)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.num_embeddings):
            bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
            raise IndexError("ServerEmbedding %r: id %d is outside its %d rows"
                             % (self.name, bad, self.num_embeddings))
        return ids

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor | None = None,
                per_sample_weights: torch.Tensor | None = None) -> torch.Tensor:
        device = ids.device
        flat = self._checked(ids).reshape(-1)
        unique, inverse = torch.unique(flat, return_inverse=True)
        if self._prefetch is not None and torch.equal(self._prefetch[0], unique):
            rows = self._gather(*self._prefetch[1])
        else:  # not prefetched (or other ids): pulled now
            rows = self._gather(*self._pull(unique))
        self._prefetch = None
        weight = rows.to(device).requires_grad_(torch.is_grad_enabled())
        if weight.requires_grad:
            self._awaiting_push = True

            def push(grad: torch.Tensor) -> None:
                self._awaiting_push = False
                self._push(unique, grad.cpu())

            weight.register_hook(push)
        local = inverse.reshape(ids.shape).to(device)
        if self.mode is None:
            return F.embedding(local, weight)
        return F.embedding_bag(local, weight, offsets, mode=self.mode,
                               per_sample_weights=per_sample_weights)
