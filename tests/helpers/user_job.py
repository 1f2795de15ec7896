"""A user's own job, as the tests of `provision run` bring it: a small torch DDP script over
gloo that imports a package from the job's own requirements, writes metric lines and saves
its model; and that package as a real wheel, made here."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

TRAIN = """\
import gc, json, os
import torch
import torch.distributed as dist
import provision_demo_extra  # from the job's own requirements

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
ddp = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
x = torch.randn(64, 4)
y = x.sum(1, keepdim=True)
for step in range(1, 21):
    opt.zero_grad()
    loss = ((ddp(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
    if rank == 0 and step % 5 == 0:
        print(f"step {step} loss {loss.item():.4f}", flush=True)
        with open(os.environ["PROVISION_METRICS"], "a") as f:
            f.write(json.dumps({"step": step, "loss": loss.item()}) + "\\n")
if rank == 0:
    torch.save(model.state_dict(), os.path.join(os.environ["PROVISION_RUN_DIR"], "outputs", "model.pt"))
    if os.environ.get("WRITE_TB"):  # TensorBoard events where provision looks for them
        from torch.utils.tensorboard import SummaryWriter

        with SummaryWriter(os.path.join(os.environ["PROVISION_RUN_DIR"], "tb")) as writer:
            writer.add_scalar("loss", loss.item(), 20)
print(f"rank {rank} of {world} on node {os.environ['SKYPILOT_NODE_RANK']} extra={provision_demo_extra.VALUE} done")
dist.barrier()
# Free the DDP wrapper's process group while the interpreter is whole: left to interpreter
# shutdown, gloo's threads abort the process now and then (training/train_ddp.py says why).
del ddp, opt
gc.collect()
dist.destroy_process_group()
"""

RUN = (
    "torchrun --nnodes $NNODES --node-rank $NODE_RANK --nproc-per-node 1 "
    "--master-addr $MASTER_ADDR --master-port $MASTER_PORT train.py"
)


def wheel(directory: Path) -> None:
    """A real (tiny) wheel, made by hand: what pip installs from the job's own wheels/."""
    name, dist = "provision_demo_extra", "provision_demo_extra-1.0"
    files = {
        f"{name}.py": b"VALUE = 42\n",
        f"{dist}.dist-info/METADATA": b"Metadata-Version: 2.1\nName: provision-demo-extra\nVersion: 1.0\n",
        f"{dist}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}.dist-info/RECORD,,")
    directory.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(directory / f"{dist}-py3-none-any.whl", "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
        z.writestr(f"{dist}.dist-info/RECORD", "\n".join(record) + "\n")
