"""The multi-worker cost model: a step of N workers is the single-replica step plus a ring all-reduce of the
gradients, and what each remedy (fewer bytes on the wire, a larger per-replica batch) would give.

    t_step(N) = t_one + a·(N−1) + 2(N−1)/N · S_wire / (efficiency · B)

``t_one`` is the measured single-replica step (the per-replica batch stays the same on N workers: weak
scaling, the global batch grows N-fold), ``S_wire`` the gradient bytes as they cross the wire
(``--allreduce_dtype``), ``B`` the link bandwidth, ``efficiency`` the share of it a gRPC ring all-reduce gets
(0.87-0.95 measured on the emulated cluster, docs/multi-node.md), and ``a`` the fixed cost of one ring step:
two one-way latencies plus a per-message overhead. tfgpu all-reduces after the backward pass, so nothing
overlaps.
"""
import dataclasses
import re

WIRE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
LINK_EFFICIENCY = 0.88  # B_eff / B of a RING all-reduce over the emulated cluster, 1-64 MB (docs/multi-node.md)
STEP_OVERHEAD_S = 0.002  # per ring step: gRPC's message handling between two workers on one host


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


def allreduce_s(num_workers: int, wire_bytes: float, bandwidth_bytes: float, latency_s: float,
                efficiency: float = LINK_EFFICIENCY) -> float:
    """One ring all-reduce of ``wire_bytes`` over ``num_workers`` (0 for one worker)."""
    if num_workers <= 1:
        return 0.0
    per_step = 2 * latency_s + STEP_OVERHEAD_S
    return per_step * (num_workers - 1) + 2 * (num_workers - 1) / num_workers * wire_bytes / (
        efficiency * bandwidth_bytes)


def predict(m: Measured, num_workers: int, bandwidth_bytes: float, latency_s: float,
            efficiency: float = LINK_EFFICIENCY) -> dict:
    """Predicted step time, examples/s and scaling efficiency of ``num_workers`` workers."""
    step = m.step_s + allreduce_s(num_workers, m.wire_bytes, bandwidth_bytes, latency_s, efficiency)
    return {"predicted_step_s": step,
            "predicted_examples_per_sec": num_workers * m.per_replica_batch / step,
            "efficiency": m.step_s / step}


def remedies(m: Measured, num_workers: int, bandwidth_bytes: float, latency_s: float,
             efficiency: float = LINK_EFFICIENCY) -> list:
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
             "efficiency": predict(changed, num_workers, bandwidth_bytes, latency_s, efficiency)["efficiency"]}
            for name, keeps, changed in options]
    return sorted(rows, key=lambda r: -r["efficiency"])
