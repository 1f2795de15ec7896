"""TEST STAND-INS for DCGM's packages in NVIDIA's CUDA repository: the host engine
(``datacenter-gpu-manager-4-core``) and the exporter (``datacenter-gpu-manager-exporter``),
with the real names, dependency, binaries, unit names and command lines.

- ``nv-hostengine`` takes the real options provision uses (``-n``, ``--service-account``,
  ``--bind-interface``, ``--port``), refuses any other, needs its service account to exist
  (the package's postinst makes it, as the real one does) and listens where it is told.
- ``dcgm-exporter`` takes ``-f`` (the field list), ``-a`` (listen address) and ``-r``
  (the host engine). It refuses a field name the real DCGM does not have, and serves on
  ``/metrics`` each listed field of each GPU, labelled as the real exporter labels them,
  with values captured from a real GPU (``GPUS``: built from the H200 ``nvidia-smi
  --query-gpu`` capture in tests/fixtures). A field that capture has no value for is left
  out, as the real exporter leaves out a blank field. While the host engine does not
  answer, it serves no field at all.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from tests.standins.nvidia_repo import Package

CORE = "datacenter-gpu-manager-4-core"
EXPORTER = "datacenter-gpu-manager-exporter"
CORE_VERSION = "1:4.4.1-1"
EXPORTER_VERSION = "4.5.2-1"
FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "nvidia-smi-query-gpu-csv_h200_590.48.01.csv"

# Real DCGM field names the stand-in knows (dcgm_fields.h), each with the nvidia-smi query
# whose captured value it serves (None: no value in the capture; served as blank, so left out).
FIELDS: dict[str, str | None] = {
    "DCGM_FI_DEV_GPU_UTIL": "utilization.gpu [%]",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "utilization.memory [%]",
    "DCGM_FI_DEV_FB_USED": "memory.used [MiB]",
    "DCGM_FI_DEV_FB_FREE": "memory.free [MiB]",
    "DCGM_FI_DEV_FB_RESERVED": "memory.reserved [MiB]",
    "DCGM_FI_DEV_GPU_TEMP": "temperature.gpu",
    "DCGM_FI_DEV_MEMORY_TEMP": "temperature.memory",
    "DCGM_FI_DEV_POWER_USAGE": "power.draw [W]",
    "DCGM_FI_DEV_SM_CLOCK": "clocks.current.sm [MHz]",
    "DCGM_FI_DEV_MEM_CLOCK": "clocks.current.memory [MHz]",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": "clocks_event_reasons.active",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "ecc.errors.uncorrected.volatile.total",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "ecc.errors.corrected.volatile.total",
    "DCGM_FI_DEV_PCIE_LINK_GEN": "pcie.link.gen.gpucurrent",
    "DCGM_FI_DEV_PCIE_LINK_WIDTH": "pcie.link.width.current",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": None,  # a pass-through H200: no NVLink
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": None,
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": None,
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": None,
    "DCGM_FI_DEV_XID_ERRORS": None,
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": None,
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": None,
}

ENGINE_UNIT = """[Unit]
Description=NVIDIA DCGM service (TEST STAND-IN)
Conflicts=dcgm.service

[Service]
User=root
PrivateTmp=false
ExecStart=/usr/bin/nv-hostengine -n --service-account nvidia-dcgm
Restart=on-abort

[Install]
WantedBy=multi-user.target
"""

EXPORTER_UNIT = """[Unit]
Description=NVIDIA DCGM-exporter service (TEST STAND-IN)
Wants=nvidia-dcgm.service
After=nvidia-dcgm.service

[Service]
User=root
PrivateTmp=false
StandardOutput=append:/var/log/dcgm-exporter.log
StandardError=append:/var/log/dcgm-exporter.log
ExecStart=/usr/bin/dcgm-exporter -f /etc/dcgm-exporter/default-counters.csv
Restart=on-abort

[Install]
WantedBy=multi-user.target
"""

HOSTENGINE = r'''#!/usr/bin/python3
"""TEST STAND-IN for nv-hostengine: the options provision uses, listening where told."""
import argparse, pwd, socket, sys

p = argparse.ArgumentParser(prog="nv-hostengine")
p.add_argument("-n", "--no-daemon", action="store_true")
p.add_argument("--service-account")
p.add_argument("-b", "--bind-interface", default="127.0.0.1")
p.add_argument("-p", "--port", type=int, default=5555)
a = p.parse_args()
if a.service_account:
    try:
        pwd.getpwnam(a.service_account)
    except KeyError:
        sys.exit(f"nv-hostengine: service account {a.service_account} does not exist")
s = socket.socket(socket.AF_INET6 if ":" in a.bind_interface else socket.AF_INET)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((a.bind_interface, a.port))
s.listen(16)
print(f"Started host engine version 4.4.1 using port number: {a.port}", flush=True)
while True:
    c, _ = s.accept()
    c.close()
'''

EXPORTER_SCRIPT = r'''#!/usr/bin/python3
"""TEST STAND-IN for dcgm-exporter: -f fields, -a address, -r host engine."""
import argparse, http.server, json, socket, sys

import os

DATA = os.path.join(os.path.dirname(os.path.realpath(sys.argv[0])), "..", "share", "dcgm-exporter-standin")
KNOWN = json.load(open(os.path.join(DATA, "fields.json")))
GPUS = json.load(open(os.path.join(DATA, "gpus.json")))
p = argparse.ArgumentParser(prog="dcgm-exporter")
p.add_argument("-f", "--collectors", default="/etc/dcgm-exporter/default-counters.csv")
p.add_argument("-a", "--address", default=":9400")
p.add_argument("-r", "--remote-hostengine-info", default="")
a = p.parse_args()
fields = []
for line in open(a.collectors):
    line = line.strip()
    if not line or line.startswith("#"):
        continue
    name, kind, help_text = (x.strip() for x in line.split(",", 2))
    if name not in KNOWN:
        sys.exit(f"dcgm-exporter: could not find DCGM field {name}")
    if kind not in ("gauge", "counter", "label"):
        sys.exit(f"dcgm-exporter: unknown metric type {kind} for {name}")
    fields.append((name, kind, help_text))
host, _, port = a.address.rpartition(":")
host = host.strip("[]")


def engine_answers():
    if not a.remote_hostengine_info:
        return True
    h, _, pt = a.remote_hostengine_info.rpartition(":")
    try:
        socket.create_connection((h.strip("[]"), int(pt)), timeout=2).close()
        return True
    except OSError:
        return False


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path != "/metrics":
            self.send_error(404)
            return
        out = []
        if engine_answers():
            for name, kind, help_text in fields:
                out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
                for gpu in GPUS:
                    value = gpu["values"].get(name)
                    if value is None:
                        continue
                    labels = (f'gpu="{gpu["index"]}",UUID="{gpu["uuid"]}",pci_bus_id="{gpu["bus_id"]}",'
                              f'device="nvidia{gpu["index"]}",modelName="{gpu["model"]}",Hostname="{socket.gethostname()}"')
                    out.append(f"{name}{{{labels}}} {value}")
        body = ("\n".join(out) + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class Server(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET6 if ":" in host else socket.AF_INET


if not engine_answers():
    sys.exit(f"dcgm-exporter: cannot connect to the host engine at {a.remote_hostengine_info}")
print(f"Starting webserver on {a.address}", flush=True)
Server((host, int(port)), Handler).serve_forever()
'''


def _number(text: str) -> float | int | None:
    """A captured value as DCGM reports it: units dropped, hex bitmasks as integers."""
    text = text.strip().split(" ")[0]
    if not text or text.startswith("[") or text in ("N/A", "[N/A]"):
        return None
    if text.startswith("0x"):
        return int(text, 16)
    try:
        number = float(text)
    except ValueError:
        return None
    return int(number) if number.is_integer() else number


def gpus_from_capture(path: Path = FIXTURE) -> list[dict[str, object]]:
    """Each GPU of an ``nvidia-smi --query-gpu ... --format=csv`` capture, as the stand-in
    exporter serves it."""
    rows = list(csv.reader(path.read_text().splitlines()))
    header = [h.strip() for h in rows[0]]
    gpus = []
    for index, row in enumerate(rows[1:]):
        captured = dict(zip(header, (v.strip() for v in row), strict=False))
        values = {name: _number(captured.get(query, "")) for name, query in FIELDS.items() if query}
        gpus.append(
            {
                "index": index,
                "uuid": captured["uuid"],
                "bus_id": captured["pci.bus_id"],
                "model": captured["name"],
                "values": {k: v for k, v in values.items() if v is not None},
            }
        )
    return gpus


def packages() -> list[Package]:
    account = (
        "getent passwd nvidia-dcgm >/dev/null || "
        "useradd --system --no-create-home --shell /usr/sbin/nologin nvidia-dcgm"
    )
    return [
        Package(
            CORE,
            CORE_VERSION,
            [],
            {"usr/bin/nv-hostengine": HOSTENGINE, "lib/systemd/system/nvidia-dcgm.service": ENGINE_UNIT},
            ("usr/bin/nv-hostengine",),
            postinst=account,
        ),
        Package(
            EXPORTER,
            EXPORTER_VERSION,
            [f"{CORE} (>= 1:4)"],
            {
                "usr/bin/dcgm-exporter": EXPORTER_SCRIPT,
                "etc/dcgm-exporter/default-counters.csv": "DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).\n",
                "lib/systemd/system/nvidia-dcgm-exporter.service": EXPORTER_UNIT,
                "usr/share/dcgm-exporter-standin/fields.json": json.dumps(sorted(FIELDS)),
                "usr/share/dcgm-exporter-standin/gpus.json": json.dumps(gpus_from_capture()),
            },
            ("usr/bin/dcgm-exporter",),
        ),
    ]
