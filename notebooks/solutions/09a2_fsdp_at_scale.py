"""Solutions to lesson 09a2's exercises. Run: python notebooks/solutions/09a2_fsdp_at_scale.py"""
from trainup.parallel.sharding import FP32_ADAM, expected


def hybrid(psi, nodes=2, per_node=4, per_param=FP32_ADAM):
    """Exercise 1: bytes of model states one GPU holds under FSDP over every rank and under HSDP
    (one replica a node: sharded over the node's GPUs only), and the collectives that cross between
    the nodes. HSDP gathers and reduce-scatters inside a replica; only the all-reduce of the
    gradient shards runs between replicas (lesson 09a2's run counts it)."""
    world = nodes * per_node
    return {
        "fsdp": (sum(expected("parameters", psi, world, per_param)),
                 ("all_gather", "reduce_scatter")),
        "hsdp": (sum(expected("parameters", psi, per_node, per_param)), ("all_reduce",)),
    }


def pieces(rows, saved_by, loaded_by):
    """Exercise 2: for each rank of the loading job, the (saving rank, first row, end row) pieces
    it reads. Shard(0) cuts a parameter as torch.chunk does; DCP's metadata says which rows each
    saving rank's file holds, and a loading rank reads where its rows overlap them."""
    import torch

    def spans(world):
        out, start = [], 0
        for chunk in torch.arange(rows).chunk(world):
            out.append((start, start + len(chunk)))
            start += len(chunk)
        return out + [(rows, rows)] * (world - len(out))  # chunk gives fewer pieces than asked

    saved = spans(saved_by)
    read = {}
    for rank, (first, end) in enumerate(spans(loaded_by)):
        read[rank] = [(owner, max(first, a), min(end, b)) for owner, (a, b) in enumerate(saved)
                      if max(first, a) < min(end, b)]
    return read


if __name__ == "__main__":
    for layout, (held, crossing) in hybrid(1e9).items():
        print(f"{layout}: {held / 1e9:.0f} GB of model states a GPU for 1e9 parameters; "
              f"between the nodes: {', '.join(crossing)}")
    for loaded_by in (4, 3):
        print(f"10 rows saved by 2, loaded by {loaded_by}: {pieces(10, 2, loaded_by)}")
