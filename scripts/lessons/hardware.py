"""Published figures of links and machines, for lesson 11's model (lessons/perfmodel.py).

Bandwidths are per direction, bytes/s, from the makers' datasheets and standards. Latencies are
NCCL's own model of one step of a ring (the Simple protocol: hwLat in NVIDIA/nccl's
src/graph/tuning.cc, 3.4 us over NVLink, 5.7 over PCIe, 9.6 over a network), since datasheets
give a wire's latency, not a collective's. GPU peaks are trainup.flops.PEAK_TFLOPS.
"""

from dataclasses import dataclass

NCCL_TUNING = "NVIDIA/nccl src/graph/tuning.cc, hwLat (Ring, Simple)"


@dataclass(frozen=True)
class Link:
    name: str
    alpha_s: float  # one ring step's latency
    beta: float  # bytes/s, per direction
    source: str


LINKS = {
    "nvlink3": Link(
        "NVLink 3 (A100 SXM4)",
        3.4e-6,
        300e9,
        "NVIDIA A100 datasheet: 600 GB/s NVLink per GPU, both directions",
    ),
    "nvlink4": Link(
        "NVLink 4 (H100 SXM5)",
        3.4e-6,
        450e9,
        "NVIDIA H100 datasheet: 900 GB/s NVLink per GPU, both directions",
    ),
    "pcie3": Link("PCIe 3.0 x16", 5.7e-6, 15.75e9, "PCI-SIG: 8 GT/s x 16 lanes, 128b/130b"),
    "pcie4": Link("PCIe 4.0 x16", 5.7e-6, 31.5e9, "PCI-SIG: 16 GT/s x 16 lanes, 128b/130b"),
    "eth25": Link("Ethernet / RoCE 25 Gbit/s", 9.6e-6, 25e9 / 8, "IEEE 802.3by"),
    "eth100": Link("Ethernet / RoCE 100 Gbit/s", 9.6e-6, 100e9 / 8, "IEEE 802.3"),
    "ib_hdr": Link("InfiniBand HDR 200 Gbit/s", 9.6e-6, 200e9 / 8, "InfiniBand Trade Association"),
    "ib_ndr": Link("InfiniBand NDR 400 Gbit/s", 9.6e-6, 400e9 / 8, "InfiniBand Trade Association"),
}


@dataclass(frozen=True)
class Node:
    """A node: its GPUs, the link between them, and its network (nics links of one kind)."""

    name: str
    gpu: str
    gpus: int
    intra: str  # a LINKS key
    inter: str  # a LINKS key
    nics: int
    source: str

    def intra_link(self):
        link = LINKS[self.intra]
        return link.alpha_s, link.beta

    def inter_link(self):
        """The node's network as one link: its NICs' bandwidth together."""
        link = LINKS[self.inter]
        return link.alpha_s, link.beta * self.nics


NODES = {
    "juwels_booster": Node(
        "JUWELS Booster (JSC)",
        "A100",
        4,
        "nvlink3",
        "ib_hdr",
        4,
        "JSC's JUWELS Booster documentation: 4 A100 (NVLink 3) and "
        "4 InfiniBand HDR200 adapters a node",
    ),
    "horovod_2017": Node(
        "Horovod's benchmark servers (2017)",
        "P100",
        4,
        "pcie3",
        "eth25",
        1,
        "Horovod's docs (benchmarks): 128 servers of 4 Pascal GPUs, "
        "RoCE-capable 25 Gbit/s network",
    ),
    "dgx_h100": Node(
        "DGX H100",
        "H100",
        8,
        "nvlink4",
        "ib_ndr",
        8,
        "NVIDIA DGX H100 datasheet: 8 H100, NVLink 4, 8 ConnectX-7 (400 Gbit/s)",
    ),
    "cloud_pcie": Node(
        "A cloud VM: 8 GPUs on PCIe, 100 Gbit/s",
        "A100",
        8,
        "pcie4",
        "eth100",
        1,
        "a common cloud shape; PCI-SIG and IEEE 802.3 figures",
    ),
}
