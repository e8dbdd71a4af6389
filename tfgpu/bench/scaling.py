"""The multi-worker cost model: a step of N workers is their compute, plus what a ring all-reduce of the gradients
costs the hosts (serialisation, gRPC, the collective's own CPU work), plus the wire; and what each remedy (fewer
bytes on the wire, a larger per-replica batch) would give.

    t_step(N) = t_compute + h_fixed·(N−1) + max(h_byte·X, 2·latency·(N−1) + X / (efficiency · B))
    X = 2(N−1)/N · S_wire   (the bytes each worker sends)

``t_compute`` is the measured single-replica step on separate hosts (the per-replica batch stays the same on N
workers: weak scaling), or, on one host, the step of N workers computing at once (``tfgpu.plan --validate``
measures it). ``h_fixed`` and ``h_byte`` are the host's own cost of the all-reduce, measured with no link limit
(``tfgpu.bench.allreduce_probe``; ``h_fixed`` per (N−1), as two workers pay it once). ``S_wire`` are the gradient
bytes as they cross the wire (``--allreduce_dtype``), ``B`` the link bandwidth, ``efficiency`` the share of it a
gRPC ring all-reduce gets (docs/benchmarks.md, 'Multi-node: scaling and the all-reduce'). tfgpu all-reduces after
the backward pass, so compute and all-reduce add; but the hosts' per-byte work streams with the wire, so of those
two the slower sets the pace
(measured: 2 workers of a 17.4 MB gradient took 490 ms a step at 1 Gbit/s and 527 ms with no link limit).
"""
import dataclasses
import re

WIRE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
LINK_EFFICIENCY = 0.88  # B_eff / B of a RING all-reduce over the emulated cluster, 1-64 MB (docs/benchmarks.md)
STEP_OVERHEAD_S = 0.002  # per ring step, when the host was not probed: gRPC's message handling, one host
TERMS = ("compute", "host all-reduce", "wire")


def parse_bandwidth(text: str) -> float:
    """``100mbit``, ``1gbit``, ``10gbit``, ``25gbit`` (bits per second) as bytes per second."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmg])bit\s*", text.lower())
    if not match:
        raise ValueError(f"{text!r} is not a bandwidth like 100mbit, 1gbit or 10gbit")
    return float(match.group(1)) * {"k": 1e3, "m": 1e6, "g": 1e9}[match.group(2)] / 8


@dataclasses.dataclass(frozen=True)
class Measured:
    """What the model needs of one replica's training: its step, batch and gradient size."""
    step_s: float
    per_replica_batch: int
    trainable_parameters: int
    allreduce_dtype: str = "float32"

    @property
    def wire_bytes(self) -> float:
        return self.trainable_parameters * WIRE_BYTES[self.allreduce_dtype]


@dataclasses.dataclass(frozen=True)
class HostCost:
    """The hosts' own cost of one step's all-reduce: ``fixed_s`` per (N−1) and ``per_byte_s`` per byte sent.
    The default, unprobed, is gRPC's message handling alone."""
    fixed_s: float = STEP_OVERHEAD_S
    per_byte_s: float = 0.0


def bytes_sent(num_workers: int, wire_bytes: float) -> float:
    """Bytes each worker sends in one ring all-reduce of ``wire_bytes``: 2(N−1)/N of them."""
    return 2 * (num_workers - 1) / num_workers * wire_bytes if num_workers > 1 else 0.0


def host_allreduce_s(num_workers: int, wire_bytes: float, host: HostCost = HostCost()) -> float:
    """What one all-reduce costs the hosts with no link limit (0 for one worker)."""
    if num_workers <= 1:
        return 0.0
    return host.fixed_s * (num_workers - 1) + host.per_byte_s * bytes_sent(num_workers, wire_bytes)


def wire_s(num_workers: int, wire_bytes: float, bandwidth_bytes: float, latency_s: float,
           efficiency: float = LINK_EFFICIENCY) -> float:
    """What the link adds to one all-reduce: the ring's latencies and its bytes at the link's effective rate."""
    if num_workers <= 1:
        return 0.0
    return 2 * latency_s * (num_workers - 1) + bytes_sent(num_workers, wire_bytes) / (efficiency * bandwidth_bytes)


def allreduce_s(num_workers: int, wire_bytes: float, bandwidth_bytes: float, latency_s: float,
                efficiency: float = LINK_EFFICIENCY, host: HostCost = HostCost()) -> float:
    """One ring all-reduce of ``wire_bytes`` over ``num_workers`` (0 for one worker): the hosts' fixed cost, then
    the slower of their per-byte work and the wire, which stream together."""
    if num_workers <= 1:
        return 0.0
    return host.fixed_s * (num_workers - 1) + max(
        host.per_byte_s * bytes_sent(num_workers, wire_bytes),
        wire_s(num_workers, wire_bytes, bandwidth_bytes, latency_s, efficiency))


def step_terms(compute_s: float, host_s: float, wire_s_: float, host_fixed_s: float = 0.0) -> dict:
    """A predicted step from its three terms (``host_s`` includes ``host_fixed_s``), and the term that dominates
    it. The hosts' per-byte work (``host_s - host_fixed_s``) and the wire stream together: the smaller of the two
    is hidden under the larger (``overlapped_s``)."""
    terms = {"compute": compute_s, "host all-reduce": host_s, "wire": wire_s_}
    overlapped = min(max(0.0, host_s - host_fixed_s), wire_s_)
    return {"predicted_step_s": sum(terms.values()) - overlapped, "terms_s": terms, "overlapped_s": overlapped,
            "dominant": max(terms, key=terms.get)}


def predict(m: Measured, num_workers: int, bandwidth_bytes: float, latency_s: float,
            efficiency: float = LINK_EFFICIENCY, host: HostCost = HostCost()) -> dict:
    """Predicted step time (and its terms), examples/s and scaling efficiency of ``num_workers`` workers."""
    row = step_terms(m.step_s, host_allreduce_s(num_workers, m.wire_bytes, host),
                     wire_s(num_workers, m.wire_bytes, bandwidth_bytes, latency_s, efficiency),
                     host.fixed_s * (num_workers - 1) if num_workers > 1 else 0.0)
    step = row["predicted_step_s"]
    return {**row, "predicted_examples_per_sec": num_workers * m.per_replica_batch / step,
            "efficiency": m.step_s / step}


def remedies(m: Measured, num_workers: int, bandwidth_bytes: float, latency_s: float,
             efficiency: float = LINK_EFFICIENCY, host: HostCost = HostCost()) -> list:
    """Each remedy's predicted scaling efficiency, best first: half the bytes on the wire (the recipe is kept),
    twice the per-replica batch (the compute per all-reduce doubles, but the global batch and so the
    optimization change), and --steps_per_loop (host round trips, not the all-reduce every step pays). Halving
    the bytes and doubling the batch differ only by the fixed per-step cost, so they rank close."""
    options = []
    if m.allreduce_dtype == "float32":
        half = dataclasses.replace(m, allreduce_dtype="bfloat16")
        options.append(("--allreduce_dtype=bfloat16", True, half))
    options.append((f"per-replica batch {2 * m.per_replica_batch}", False,
                    dataclasses.replace(m, step_s=2 * m.step_s, per_replica_batch=2 * m.per_replica_batch)))
    options.append(("--steps_per_loop", True, m))
    rows = [{"remedy": name, "keeps_recipe": keeps,
             "efficiency": predict(changed, num_workers, bandwidth_bytes, latency_s, efficiency, host)["efficiency"]}
            for name, keeps, changed in options]
    return sorted(rows, key=lambda r: -r["efficiency"])


def missed_term(rows: list) -> str:
    """Which term of the prediction missed, from rows of one worker count ({"terms_s", "predicted_step_s",
    "measured_step_s"}): the term that, scaled alone by one factor, best explains every row's miss (least
    squares). Compute and the host's all-reduce do not change with the link, so rows cannot tell them apart:
    between the two (and with a single row, among all three) the larger term is named."""
    misses = [r["measured_step_s"] - r["predicted_step_s"] for r in rows]

    def leftover(term):
        xs = [r["terms_s"][term] for r in rows]
        sxx = sum(x * x for x in xs)
        k = sum(x * d for x, d in zip(xs, misses)) / sxx if sxx else 0.0
        return sum((d - k * x) ** 2 for x, d in zip(xs, misses))

    left = {t: leftover(t) for t in TERMS}
    best = min(left.values())
    tied = [t for t in TERMS if left[t] <= best * (1 + 1e-9) + 1e-15]
    return max(tied, key=lambda t: sum(r["terms_s"][t] for r in rows))
