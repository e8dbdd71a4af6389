"""Mixed precision: the Keras dtype policy, dynamic loss scaling for float16, and the non-finite step guard.

Models compute in the policy's dtype; ``tfgpu.models.create_model`` keeps
logits in float32 and tasks compute losses in float32. Only float16 needs a
loss scale (bfloat16 has float32's exponent range). Under every policy a step
whose loss or gradient is non-finite on any replica is skipped, and a skipped
step changes no variable (weights, optimizer slots and iterations, BatchNorm
statistics) except, under float16 alone, the loss scale.

``--precision=auto`` becomes one of the policies once, when the run starts (``resolve_config``, called by
``experiment.setup`` before anything reads the precision or writes config.yaml): ``resolve_auto`` is the pure
rule over recorded facts (the doctor's rule, ``runtime.advice.precision_for``). Each worker resolves it from its
own devices, and the workers of a multi-worker job then agree in one all-reduce on the policy of the least capable
among them (``least_capable``), so every worker builds the same variables.
"""
import contextlib
import dataclasses
import logging
import re

import keras
import tensorflow as tf

from tfgpu.config import Config, PrecisionConfig
from tfgpu.runtime import advice, host

MIN_LOSS_SCALE = 1.0  # a float16 scale backs off no lower than this (or the initial scale, if lower)
BY_CAPABILITY = ("float32", "mixed_float16", "mixed_bfloat16")
ALLREDUCE_DTYPES = ("float32", "bfloat16", "float16")  # --allreduce_dtype: what gradients cross the wire in  # each needs more of the hardware than the last

log = logging.getLogger("tfgpu")


def resolve_auto(cpu_flags: dict, gpus: list) -> tuple:
    """(policy, reason) that ``--precision=auto`` stands for on a run over ``gpus`` (dicts with "name" and
    "compute_capability" such as "8.0"; the oldest decides) or, with none, on a CPU with ``cpu_flags``
    (``runtime.host.parse_cpuinfo``'s flags): mixed_bfloat16 from compute capability 8.0 and on CPUs with
    AMX (not with AVX512_BF16 alone, where it ran slower than float32), mixed_float16 on 7.x, float32 otherwise."""
    return advice.precision_for(cpu_flags, gpus)


def run_gpus(placement) -> list:
    """The GPUs this run computes on (its placement's GPU devices) as TensorFlow describes them: name and
    compute capability ("0.0" when TensorFlow reports none, e.g. a GPU that is not NVIDIA's)."""
    visible = tf.config.get_visible_devices("GPU")  # logical GPU i is visible physical GPU i
    gpus = []
    for device in placement.devices:
        index = re.search(r"GPU:(\d+)$", device, re.IGNORECASE)
        if index and int(index.group(1)) < len(visible):
            physical = visible[int(index.group(1))]
            details = tf.config.experimental.get_device_details(physical)
            gpus.append({"name": details.get("device_name", physical.name),
                         "compute_capability": ".".join(map(str, details.get("compute_capability", (0, 0))))})
    return gpus


def least_capable(choices) -> str:
    """The policy every device of a job can run, from each device's own choice: the oldest decides."""
    return min(choices, key=BY_CAPABILITY.index)


def _agree_across_workers(strategy, chosen: str) -> str:
    """The job's policy: an all-reduce of each replica's choice (counts per policy), then ``least_capable``."""
    mine = tf.one_hot(BY_CAPABILITY.index(chosen), len(BY_CAPABILITY))
    counts = strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.identity(mine)), axis=None)
    return least_capable([p for p, n in zip(BY_CAPABILITY, counts.numpy()) if n > 0])


def resolve_config(config: Config, placement) -> Config:
    """``config`` with ``--precision=auto`` replaced by the policy for this run's devices (the choice and its
    reason logged in one line; with several workers, the policy all of them can run); any other precision
    unchanged."""
    if config.precision != "auto":
        return config
    gpus = run_gpus(placement)
    chosen, why = resolve_auto({} if gpus else host.cpu_facts()["flags"], gpus)
    job = _agree_across_workers(placement.strategy, chosen) if placement.num_workers > 1 else chosen
    if job == chosen:
        log.info("precision: --precision=auto chose %s (%s)", chosen, why)
    else:
        log.info("precision: --precision=auto chose %s, which every worker can run (this worker alone would "
                 "run %s: %s)", job, chosen, why)
    return dataclasses.replace(config, precision=job)


@contextlib.contextmanager
def float32_policy():
    """Builds models in float32 whatever the run's dtype policy (exports, FID feature extractors)."""
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("float32")
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous)


def set_policy(precision: str) -> None:
    """Sets the global Keras dtype policy; call before building models."""
    if precision == "auto":
        raise ValueError("precision 'auto' is not a dtype policy: resolve it first (resolve_config)")
    keras.mixed_precision.set_global_policy(precision)


@keras.saving.register_keras_serializable("tfgpu")
class GuardedOptimizer(keras.optimizers.LossScaleOptimizer):
    """Applies an update only when every gradient is finite; a skipped step changes nothing else.

    Keras' LossScaleOptimizer provides the skip (a ``cond`` around the inner optimizer's update, taken in a
    cross-replica context where the strategy needs a merge call), but it halves its scale on every skipped
    step with no floor: a scale of 1 used only as a guard reaches 0 after about 150 skips, gradients then
    read as 0 (finite) and the next update divides by 0. So:

    - ``dynamic=False`` (float32, bfloat16): no scale at all. The loss is not multiplied, gradients are not
      divided, nothing is counted; ``dynamic_scale`` stays at 1 and a skipped step touches no variable.
    - ``dynamic=True`` (float16): Keras' dynamic scale (halve on a skip, double after ``dynamic_growth_steps``
      finite steps) that backs off no lower than ``MIN_LOSS_SCALE`` (or ``initial_scale`` when that is
      lower): a smaller scale only makes float16 gradients underflow, and 0 would turn every gradient
      into 0/0.
    """

    def __init__(self, inner_optimizer, initial_scale=2.0 ** 15, dynamic_growth_steps=2000, dynamic=True,
                 name=None, allreduce_dtype="float32"):
        if not initial_scale > 0 or (not dynamic and initial_scale != 1.0):
            raise ValueError(f"initial loss scale {initial_scale}: must be positive, and 1 without dynamic scaling")
        if allreduce_dtype not in ALLREDUCE_DTYPES:
            raise ValueError(f"allreduce_dtype {allreduce_dtype!r}: use one of {', '.join(ALLREDUCE_DTYPES)}")
        super().__init__(inner_optimizer, initial_scale=float(initial_scale),
                         dynamic_growth_steps=dynamic_growth_steps, name=name)
        self.dynamic = bool(dynamic)
        self.min_scale = min(MIN_LOSS_SCALE, float(initial_scale))
        self.allreduce_dtype = allreduce_dtype
        self._summed_calls = 0
        keras_sum = inner_optimizer._all_reduce_sum_gradients

        def all_reduce_sum_gradients(grads_and_vars):
            # Gradients apply_if_finite already summed across replicas (in --allreduce_dtype) are not summed again.
            return list(grads_and_vars) if self._summed_calls else keras_sum(grads_and_vars)

        inner_optimizer._all_reduce_sum_gradients = all_reduce_sum_gradients

    def scale_loss(self, loss):
        return super().scale_loss(loss) if self.dynamic else loss

    @property
    def loss_scale(self):
        """The current scale as a float32 tensor (exactly 1 without dynamic scaling)."""
        if not self.dynamic:
            return tf.constant(1.0, tf.float32)
        return tf.cast(tf.convert_to_tensor(self.dynamic_scale), tf.float32)

    def check_finite(self, grads):
        """Keras' check before its ``cond``. Gradients that ``apply_if_finite`` poisoned are all NaN or all
        finite, so their first element decides (one kernel instead of two per gradient, as the step's
        finiteness was already all-reduced); gradients given to ``apply`` directly get Keras' full check."""
        sized = [g for g in grads if g is not None and g.shape.num_elements()]
        if getattr(self, "_poisoned_calls", 0) and sized:
            return tf.math.is_finite(tf.reshape(sized[0], [-1])[0])
        return super().check_finite(grads)

    def apply_poisoned(self, grads, trainable_variables, summed: bool = False):
        """``apply`` of gradients that ``apply_if_finite`` made all NaN on a skipped step (on every replica);
        ``summed``: they are already the cross-replica sum (``all_reduce_in``), which the inner optimizer then
        applies as it is instead of summing again."""
        self._poisoned_calls = getattr(self, "_poisoned_calls", 0) + 1
        self._summed_calls += int(summed)
        try:
            self.apply(grads, trainable_variables)
        finally:
            self._poisoned_calls -= 1
            self._summed_calls -= int(summed)

    def _stateful_handle_finite_grads(self, grads, trainable_variables):
        if self.dynamic:
            super()._stateful_handle_finite_grads(grads, trainable_variables)
        else:
            self.inner_optimizer.apply(grads, trainable_variables=trainable_variables)

    def _stateful_handle_non_finite_grads(self):
        if self.dynamic:
            self.step_counter.assign(0)
            self.dynamic_scale.assign(tf.maximum(self.dynamic_scale * 0.5, self.min_scale))

    def stateless_apply(self, optimizer_variables, grads, trainable_variables):
        raise NotImplementedError("GuardedOptimizer applies updates statefully (the TensorFlow backend); "
                                  "Keras' stateless path would halve the scale without a floor")

    def get_config(self):
        return {**super().get_config(), "dynamic": self.dynamic, "allreduce_dtype": self.allreduce_dtype}


def wrap_optimizer(optimizer: keras.optimizers.Optimizer, config: PrecisionConfig) -> GuardedOptimizer:
    """Wraps ``optimizer`` in the non-finite step guard: with dynamic loss scaling under mixed_float16, with
    no scaling otherwise. Every optimizer of a task goes through here (Keras' compile-time wrapping covers
    only one)."""
    if config.precision == "auto":
        raise ValueError("precision 'auto' is not a dtype policy: resolve it first (resolve_config)")
    if config.precision == "mixed_float16":
        return GuardedOptimizer(optimizer, initial_scale=config.initial_loss_scale,
                                dynamic_growth_steps=config.loss_scale_growth_steps,
                                allreduce_dtype=config.allreduce_dtype)
    return GuardedOptimizer(optimizer, initial_scale=1.0, dynamic=False, allreduce_dtype=config.allreduce_dtype)


def guard(optimizer: keras.optimizers.Optimizer, config: PrecisionConfig | None = None) -> GuardedOptimizer:
    """``optimizer`` behind the non-finite step guard, for the Keras models of tfgpu's tasks (``tfgpu.GAN``, the
    classifier's): as it is when it is a ``GuardedOptimizer`` already; else ``wrap_optimizer`` with ``config``, by
    default the options' defaults under Keras' global dtype policy. A Keras ``LossScaleOptimizer`` is refused: the
    guard scales the loss itself, and Keras' scale would back off to 0 after enough skipped steps."""
    if isinstance(optimizer, GuardedOptimizer):
        return optimizer
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        raise ValueError("optimizer: give the inner optimizer, not a keras LossScaleOptimizer (tfgpu wraps it in its "
                         "non-finite guard, with loss scaling under mixed_float16)")
    return wrap_optimizer(optimizer, config or PrecisionConfig.defaults(
        precision=keras.mixed_precision.global_policy().name))


def all_reduce_in(dtype: str, ctx, grads) -> list:
    """The cross-replica sum of ``grads`` with each gradient cast to ``dtype`` on the wire and back to its own
    dtype after: the same values on every replica, half the bytes for bfloat16/float16. A float16 sum beyond
    float16's range arrives as inf, which the caller's finiteness check sees on every replica alike."""
    wire = [tf.cast(g, dtype) for g in grads]
    return [tf.cast(s, g.dtype) for s, g in zip(ctx.all_reduce(tf.distribute.ReduceOp.SUM, wire), grads)]


def clip_by_global_norm(grads, clip_norm: float, loss_scale, num_replicas: int, summed: bool = False):
    """Clips the all-reduced gradient to ``clip_norm`` (measured unscaled) and returns per-replica shares.

    Keras clips each replica's partial gradient before the all-reduce; this clips the true global
    gradient instead. The optimizer sums the returned shares over replicas, giving the clipped sum.
    ``summed``: ``grads`` are the cross-replica sum already (--allreduce_dtype; pass ``num_replicas=1``),
    clipped as they are. Returns (grads, global_norm).
    """
    ctx = tf.distribute.get_replica_context()
    total = grads if summed or not ctx else ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads)
    norm = tf.linalg.global_norm([tf.cast(g, tf.float32) for g in total]) / loss_scale
    factor = tf.minimum(1.0, clip_norm / (norm + 1e-12))
    return [g * tf.cast(factor / num_replicas, g.dtype) for g in total], norm


def apply_if_finite(optimizer, loss, grads, variables, clip_norm: float = 0.0, num_replicas: int = 1):
    """Applies ``grads`` unless the loss or a gradient on *any* replica is non-finite; returns (finite, norm).

    Keras' LossScaleOptimizer checks only the first replica's local gradients, so finiteness is decided here
    with an all-reduce, and a bad step poisons every replica's gradients so all of them skip it (and the
    float16 scale backs off). ``clip_norm`` > 0 clips the all-reduced gradient (``norm`` is measured first).
    With a GuardedOptimizer whose ``allreduce_dtype`` is not float32, and several replicas, the gradients are
    summed here in that dtype (``all_reduce_in``) and the sum must be finite too (a float16 overflow skips the
    step everywhere, as the sum is the same on every replica); the optimizer then applies the sum as it is.
    """
    local_bad = tf.logical_not(tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads] +
                                             [tf.math.is_finite(loss)]))
    ctx = tf.distribute.get_replica_context()
    bad = ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.cast(local_bad, tf.float32)) if ctx else \
        tf.cast(local_bad, tf.float32)
    finite = tf.equal(bad, 0.0)
    dtype = getattr(optimizer, "allreduce_dtype", "float32")
    summed = dtype != "float32" and ctx is not None and ctx.num_replicas_in_sync > 1
    if summed:
        grads = all_reduce_in(dtype, ctx, grads)
        finite = tf.logical_and(finite, tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads]))
    norm = None
    if clip_norm:
        grads, norm = clip_by_global_norm(grads, clip_norm, current_loss_scale(optimizer),
                                                     1 if summed else num_replicas, summed=summed)
    poison = tf.where(finite, 0.0, float("nan"))
    poisoned = [g + tf.cast(poison, g.dtype) for g in grads]
    if isinstance(optimizer, GuardedOptimizer):
        optimizer.apply_poisoned(poisoned, variables, summed=summed)
    else:
        optimizer.apply(poisoned, variables)
    return finite, norm


GENERAL_NONFINITE_ADVICE = "Lower the learning rate, set --grad_clip_norm, or use --precision=float32/mixed_bfloat16."


def nonfinite_advice(optimizers, num_replicas: int) -> str:
    """What to do about steps skipped as non-finite. With float16 on the wire (--allreduce_dtype=float16, several
    replicas) the likely cause is the all-reduce: float16 ends at 65504, so a sum of gradients each replica holds
    finite (a float32 run's, whose own loss and gradients the guard found finite) overflows to inf there."""
    on_the_wire = {getattr(o, "allreduce_dtype", "float32") for o in optimizers if isinstance(o, GuardedOptimizer)}
    if num_replicas > 1 and "float16" in on_the_wire:
        return (f"The gradients of the {num_replicas} replicas are summed in float16 (--allreduce_dtype=float16), "
                "whose largest value is 65504: a sum beyond it is inf even when each replica's loss and gradients "
                "are finite. Use --allreduce_dtype=bfloat16 (float32's range, half the bytes) or "
                "--allreduce_dtype=float32; otherwise " + GENERAL_NONFINITE_ADVICE[0].lower()
                + GENERAL_NONFINITE_ADVICE[1:])
    return GENERAL_NONFINITE_ADVICE


def restore_if_not_finite(finite, variables, saved) -> None:
    """Puts back state a skipped step's forward pass changed (BatchNorm statistics, spectral-norm vectors)."""
    for variable, value in zip(variables, saved):
        variable.assign(tf.where(finite, variable.value, value))


def scale_loss(optimizer, loss):
    """Multiplies ``loss`` by the optimizer's current loss scale (no-op without loss scaling)."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return optimizer.scale_loss(loss)
    return loss


def current_loss_scale(optimizer):
    """The optimizer's current loss scale as a float32 tensor; 1.0 without dynamic loss scaling."""
    if isinstance(optimizer, GuardedOptimizer):
        return optimizer.loss_scale
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return tf.cast(tf.convert_to_tensor(optimizer.dynamic_scale), tf.float32)
    return tf.constant(1.0, tf.float32)
