"""GAN training under the flag command (``--task=gan``): the GAN model of ``model.py`` built from the flags, its
step's shares handed to the flag command's loop, FID/KID and samples (``evaluation.py``), the export.

The step itself (``n_critic`` critic updates, each on a fresh real batch: the trainer hands the step ``n_critic``
consecutive batches; the generator update; penalties, DiffAugment, EMA, the non-finite guard; stateless draws from
(--seed, step, purpose) that follow the run's one step counter) is ``model.GAN.step_shares``, the same that
``GAN.train_step`` runs under ``model.fit`` and ``tfgpu.fit``. The checkpoint keeps its layout: generator,
discriminator, g_optimizer, d_optimizer, gan_state.
"""
import logging

import keras

from tfgpu.runtime import fileio, precision
from tfgpu.tasks.gan import diffaugment, network_checks
from tfgpu.config import ConfigError, PrecisionConfig
from tfgpu.models import get_spec
from tfgpu.tasks.base import MetricSpec, Task, register_task
from tfgpu.tasks.gan.evaluation import GanEvaluation
from tfgpu.tasks.gan.model import GAN
from tfgpu.tasks.gan.options import GanOptions

log = logging.getLogger("tfgpu")


@register_task("gan")
class GanTask(GanEvaluation, Task):
    _LR = "Learning rate (and the float16 loss scale)"
    metrics = (
        MetricSpec("d_loss", plot="gan_losses", title="GAN losses", panel="loss", label="D loss", scale="log",
                   progress=True),
        MetricSpec("g_loss", plot="gan_losses", panel="loss", label="G loss", progress=True),
        MetricSpec("d_real", plot="gan_losses", panel="mean D logit", label="real images"),
        MetricSpec("d_fake", plot="gan_losses", panel="mean D logit", label="generated images"),
        MetricSpec("gradient_penalty"),
        MetricSpec("r1_penalty"),
        MetricSpec("nonfinite_steps", counts_nonfinite=True),
        MetricSpec("fid", kind="eval", lower_is_better=True, plot="fid", title="FID / KID (lower is better)",
                   panel="FID", label="FID"),
        MetricSpec("kid", kind="eval", lower_is_better=True, plot="fid", panel="KID", label="KID"),
        MetricSpec("samples", kind="eval", style="image", title="Samples", label="generated samples"),
        MetricSpec("learning_rate_g", plot="learning_rate", title=_LR, panel="learning rate", label="G", scale="log"),
        MetricSpec("learning_rate_d", plot="learning_rate", panel="learning rate", label="D", scale="log"),
        MetricSpec("loss_scale_g", plot="learning_rate", panel="loss scale", label="G", scale="log2"),
        MetricSpec("loss_scale_d", plot="learning_rate", panel="loss scale", label="D", scale="log2"),
    )
    report_sections = ("tfgpu.tasks.gan.report:fid_section",)
    report_options = ("gan_loss", "latent_dim", "g_learning_rate", "d_learning_rate", "n_critic", "gradient_penalty",
                      "ema_decay", "diffaugment")
    evaluates_without_eval_split = True  # FID/KID are scored on the train split

    @classmethod
    def batches_per_step(cls, config):
        """A fresh real batch for each of the critic's --n_critic updates (as in WGAN-GP)."""
        return GanOptions.of(config).n_critic


    @property
    def options(self) -> GanOptions:
        """The GAN's own options section (--n_critic, --gan_loss, ...); the shared ones are ``self.config``'s."""
        return GanOptions.of(self.config)

    def __init__(self, config, info, placement, total_steps, global_step, resumed_examples=None):
        super().__init__(config, info, placement, total_steps, global_step, resumed_examples)
        self._check_config()
        self._extractor = None
        self._real_features = None
        self._eval_generator = None
        self._writer = None
        self._barrier = None

    # -- setup -------------------------------------------------------------------
    def _check_config(self):
        """Fails with the flag's name before any model is built."""
        config = self.config
        options = self.options
        if get_spec(config.model).family != "gan":
            raise ConfigError("model", f"{config.model} is not a GAN (use dcgan, wgan_gp or sngan) or use "
                              "--task=classification")
        try:
            diffaugment.parse_policy(options.diffaugment)
        except ValueError as e:
            raise ConfigError("diffaugment", str(e)) from None
        from tfgpu.models.gan import stage_sizes

        try:
            if not (options.generator and options.discriminator):  # the family builds one of the networks
                stage_sizes(self.info.image_shape)
        except ValueError as e:
            raise ConfigError("image_size", str(e)) from None
        if options.conditional and self.info.num_classes < 2:
            raise ConfigError("conditional", f"needs labelled data; {self.info.name} has "
                              f"{self.info.num_classes} classes")
        if (self.info.num_classes < 2 and config.eval_split != "none" and not options.inception_weights
                and not options.fid_feature_model_dir):
            log.warning("%s has %d class(es): no feature classifier can be trained on it, so FID/KID will use "
                        "an untrained (randomly initialised) network's features (metrics.json says so in "
                        "feature_extractor_trained). Pass --inception_weights or --fid_feature_model_dir for "
                        "trained features, or --eval_split=none to skip FID/KID.", self.info.name,
                        self.info.num_classes)
        if options.inception_weights and not fileio.isfile(options.inception_weights):
            raise ConfigError("inception_weights", f"file {options.inception_weights!r} does not exist (FID never "
                              "downloads weights)")
        if options.inception_weights:
            from tfgpu.tasks.gan.fid import weights_file_problem

            if weights_file_problem(options.inception_weights):
                raise ConfigError("inception_weights", weights_file_problem(options.inception_weights))
        if options.fid_feature_model_dir and not options.inception_weights:
            from tfgpu.tasks.gan.fid import classifier_model_path

            path = classifier_model_path(options.fid_feature_model_dir)
            if not fileio.isfile(path):
                raise ConfigError("fid_feature_model_dir", f"{path} does not exist; train the classifier first "
                                  "(python -m tfgpu.train --task=classification ...) or leave the flag empty to "
                                  "train one automatically")

    def build(self):
        config = self.config
        options = self.options
        self.generator, self.discriminator = self._networks(("generator", "discriminator"))
        named = {flag: (flag, getattr(options, flag)) if getattr(options, flag) else ("model", config.model)
                 for flag in ("generator", "discriminator")}
        self.generator_head = network_checks.check_generator(self.generator, *named["generator"])
        network_checks.check_discriminator(self.discriminator, *named["discriminator"], options.gan_loss)
        self.model = GAN(self.generator, self.discriminator, options.latent_dim, conditional=options.conditional,
                         num_classes=max(self.info.num_classes, 1), gan_loss=options.gan_loss,
                         n_critic=options.n_critic, gradient_penalty=options.gradient_penalty,
                         r1_gamma=options.r1_gamma, diffaugment=options.diffaugment, ema_decay=options.ema_decay,
                         seed=config.seed, global_batch_size=config.global_batch_size,
                         step_counter=self.global_step, name="gan")
        self.model.compile(self._optimizer(options.g_learning_rate, "generator_adam"),
                           self._optimizer(options.d_learning_rate, "discriminator_adam"),
                           precision_config=PrecisionConfig.of(config), grad_clip_norm=config.grad_clip_norm)
        self.g_optimizer, self.d_optimizer = self.model.g_optimizer, self.model.d_optimizer  # guarded, built
        self.state = self.model.state
        self._initial_generator_weights = [w.numpy() for w in self.generator.weights]  # for fid_initial

    def _networks(self, which) -> list:
        """The networks named in ``which`` ("generator", "discriminator"): the user's builder where --generator or
        --discriminator names one (``tfgpu.models.user.build_gan_network``), else the --model family's; each given
        the run's model options it takes."""
        from tfgpu.models import registry, user

        config = self.config
        options = self.options
        shape, classes = self.info.image_shape, max(self.info.num_classes, 1)
        family = None
        nets = []
        for name in which:
            if getattr(options, name):
                nets.append(user.build_gan_network(name, getattr(options, name), shape, classes, options.latent_dim,
                                                   options.conditional, sync_batch_norm=config.sync_batch_norm))
                continue
            if family is None:
                spec = get_spec(config.model)
                family = spec.builder(shape, classes, latent_dim=options.latent_dim, conditional=options.conditional,
                                      **registry.options_for(spec, registry.model_options(config)))
            nets.append(getattr(family, name))
        return nets

    def _optimizer(self, learning_rate, name):
        options = self.options
        return keras.optimizers.Adam(learning_rate, beta_1=options.adam_beta1, beta_2=options.adam_beta2, name=name)

    @property
    def train_metric_names(self):
        return self.model.share_names

    def checkpoint_items(self):
        return {"generator": self.generator, "discriminator": self.discriminator, "g_optimizer": self.g_optimizer,
                "d_optimizer": self.d_optimizer, "gan_state": self.state}

    def _generate(self, generator, z, labels, training):
        return self.model.generate_with(generator, z, labels, training)

    def train_step(self, batch):
        """The GAN's step on this replica's ``n_critic`` real batches (one, not in a tuple, when n_critic is 1): its
        shares, for the flag command's loop, which advances the run's step counter."""
        return self.model.step_shares(batch if self.options.n_critic > 1 else (batch,))

    # -- evaluation, samples, export -------------------------------------------------------------
    def eval_metric_names(self):
        return ()

    def learning_rates(self):
        return {"learning_rate_g": self.options.g_learning_rate, "learning_rate_d": self.options.d_learning_rate}

    def loss_scales(self):
        if self.config.precision != "mixed_float16":
            return {}
        return {"loss_scale_g": float(precision.current_loss_scale(self.g_optimizer)),
                "loss_scale_d": float(precision.current_loss_scale(self.d_optimizer))}

    def model_facts(self):
        return {"generator_output": self.generator_head.activation or "linear"}

    @classmethod
    def describe_export(cls, config, info, facts: dict) -> dict:
        return network_checks.describe_generator(config, info, facts)

    def describe(self):
        from tfgpu.models.summary import count_params

        return (f"model={self.config.model} generator params={count_params(self.generator):,} discriminator "
                f"params={count_params(self.discriminator):,} image={self.info.image_shape} "
                f"latent={self.options.latent_dim} conditional={self.options.conditional} loss={self.options.gan_loss}")

    def deployable(self, variant=""):
        """The generator with the EMA weights (float32 images out)."""
        generator, _ = self._evaluation_generator()
        generator.set_weights(self.generator_weights())
        return generator
