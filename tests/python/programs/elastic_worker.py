"""A Horovod elastic training script, as users write one (hvd.elastic.run, TorchState,
ElasticSampler), on a small deterministic problem: a linear model fitting y = x . w_true.

It logs what it does, one JSON line per event, to ELASTIC_LOG_DIR/events-<pid>.jsonl: "step"
(rank, size, epoch, batch, the membership's workers), "reset", "sync" (the state broadcast from
rank 0), "final" (a checksum of the weights). The test kills and adds workers while it trains; it stops once rank 0 finds
ELASTIC_LOG_DIR/stop at the end of an epoch (every rank learns it from rank 0's broadcast).

argv: [seconds per batch]
"""

import json
import os
import sys
import time

import torch

import dtrain.torch as hvd

LOG_DIR = os.environ["ELASTIC_LOG_DIR"]
BATCH_SECONDS = float(sys.argv[1]) if len(sys.argv) > 1 else 0.02
BATCH = 8
EPOCH_MIN = 2

log = open(os.path.join(LOG_DIR, "events-%d.jsonl" % os.getpid()), "a", buffering=1)


def event(kind, **fields):
    fields.update(kind=kind, pid=os.getpid(), worker=int(os.environ["DTRAIN_NODE_RANK"]),
                  t=time.time())
    log.write(json.dumps(fields) + "\n")


hvd.init()
torch.manual_seed(1234 + hvd.rank())  # different on every rank: sync() must make them equal
generator = torch.Generator().manual_seed(7)
x = torch.randn(256, 4, generator=generator)
y = x @ torch.tensor([1.0, -2.0, 3.0, 0.5])
dataset = torch.utils.data.TensorDataset(x, y)

model = torch.nn.Linear(4, 1, bias=False)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                     named_parameters=model.named_parameters())
sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=3)
state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0, resets=0)
state.register_reset_callbacks([lambda: event("reset", rank=hvd.rank(), size=hvd.size())])
sync_state = state.sync


def logged_sync():
    event("sync", rank=hvd.rank(), size=hvd.size())
    sync_state()


state.sync = logged_sync  # type: ignore[method-assign]


@hvd.elastic.run
def train(state):
    while True:
        # The sampler holds what this epoch has left (after a reset: re-split over the ranks).
        loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=state.sampler)
        for i, (xb, yb) in enumerate(loader):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xb).squeeze(1), yb)
            loss.backward()
            optimizer.step()
            state.sampler.record_batch(i, BATCH)
            state.batch += 1
            event("step", rank=hvd.rank(), size=hvd.size(), epoch=state.epoch, batch=state.batch,
                  loss=float(loss))
            time.sleep(BATCH_SECONDS)
            if state.batch % 4 == 0:
                state.commit()
        state.epoch += 1
        state.batch = 0
        state.sampler.set_epoch(state.epoch)
        stop = hvd.rank() == 0 and state.epoch >= EPOCH_MIN and \
            os.path.exists(os.path.join(LOG_DIR, "stop"))
        state.commit()
        if hvd.broadcast_object(stop, 0, name="stop"):
            return


train(state)
weights = model.weight.detach().flatten().tolist()
event("final", rank=hvd.rank(), size=hvd.size(), epoch=state.epoch, weights=weights)
