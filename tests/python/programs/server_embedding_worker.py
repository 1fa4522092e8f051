"""A worker that trains dtrain.torch.ServerEmbedding tables (an Embedding and a sum
EmbeddingBag, several shards each) beside the same tables held as whole keys and pushed as
nn.Embedding(sparse=True)'s gradients, and checks after every step that both give the same
rows, and the same outputs. Run under `dtrain launch -n N -s S`; prints
"server_embedding_worker OK rank R" at the end.
"""

import torch
import torch.nn.functional as F

import dtrain
import dtrain.torch

ROWS, DIM, STEPS, SHARD = 1000, 8, 4, 300


def reference_table(seed):
    """The table ServerEmbedding initialises, whole: its shards' draws, one after another."""
    parts = []
    for i in range((ROWS + SHARD - 1) // SHARD):
        rows = min(SHARD, ROWS - i * SHARD)
        parts.append(torch.randn(rows, DIM, generator=torch.Generator().manual_seed(seed + i))
                     * 0.01)
    return torch.cat(parts)


def batch(rank, step):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randint(0, ROWS, (12,), generator=g)  # repeats and shards mixed


def main():
    kv = dtrain.kv.create("dist_sync")
    emb = dtrain.torch.ServerEmbedding(ROWS, DIM, kv, name="emb", shard_rows=SHARD, seed=1)
    bag = dtrain.torch.ServerEmbedding(ROWS, DIM, kv, name="bag", mode="sum", shard_rows=SHARD,
                                       seed=7)
    kv.init("emb_ref", reference_table(1))
    kv.init("bag_ref", reference_table(7))
    kv.set_optimizer(dtrain.optimizer.create("sgd", learning_rate=0.5, momentum=0.9, wd=0.01))
    every = torch.arange(ROWS)
    scale = torch.linspace(-1, 1, DIM)
    for step in range(STEPS):
        ids = batch(kv.rank, step)
        offsets = torch.tensor([0, 5])
        ref_emb = kv.row_sparse_pull("emb_ref", row_ids=every).to_dense()
        ref_bag = kv.row_sparse_pull("bag_ref", row_ids=every).to_dense()
        out = emb(ids)
        bagged = bag(ids, offsets)
        if not torch.allclose(out, F.embedding(ids, ref_emb), atol=1e-7):
            raise AssertionError("step %d: the Embedding's output differs" % step)
        if not torch.allclose(bagged, F.embedding_bag(ids, ref_bag, offsets, mode="sum"),
                              atol=1e-6):
            raise AssertionError("step %d: the EmbeddingBag's output differs" % step)
        if step % 2:
            emb.prefetch(batch(kv.rank, step + 1))  # asked for once this step's push is in
        ((out * scale).sum() + (bagged * scale).sum()).backward()
        # The same gradients, as the whole tables' sparse gradients.
        dense_emb = torch.nn.Embedding.from_pretrained(ref_emb, freeze=False, sparse=True)
        dense_bag = torch.nn.EmbeddingBag.from_pretrained(ref_bag, freeze=False, mode="sum",
                                                          sparse=True)
        ((dense_emb(ids) * scale).sum() + (dense_bag(ids, offsets) * scale).sum()).backward()
        kv.push("emb_ref", dense_emb.weight.grad)
        kv.push("bag_ref", dense_bag.weight.grad)
    with torch.no_grad():
        for table, ref in ((emb, "emb_ref"), (bag, "bag_ref")):
            got = table(every, torch.arange(ROWS)) if table.mode else table(every)
            want = kv.row_sparse_pull(ref, row_ids=every).to_dense()
            if not torch.allclose(got, want, atol=1e-6):
                bad = (got - want).abs().max(dim=1).values.argmax().item()
                raise AssertionError("%s row %d: %s vs %s" % (table.name, bad, got[bad].tolist(),
                                                             want[bad].tolist()))
    rank = kv.rank
    kv.close()
    print("server_embedding_worker OK rank %d" % rank)


if __name__ == "__main__":
    main()
