"""The GAN's section of the run report: what the last FID/KID was measured with.

Declared by the GAN task (``GanTask.report_sections``) and called by
``tfgpu.reporting.report`` with the run's metrics and eval records. No TensorFlow here:
the report runs in a light process.
"""
import math


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def fid_section(metrics: dict, evals: list) -> list:
    """Markdown lines naming what the last FID/KID was measured with: the feature extractor and the number of
    images (an FID is biased upward at small N and compares only with FIDs of the same extractor and N)."""
    source = metrics if _finite(metrics.get("fid")) else next((r for r in reversed(evals) if _finite(r.get("fid"))),
                                                              None)
    if source is None:
        return []
    num = source.get("fid_num_samples", source.get("fid_num_fake"))
    scores = f"FID {source['fid']:.4g}"
    if _finite(source.get("kid")):
        scores += f" and KID {source['kid']:.4g}"
    if _finite(num):
        scores += f" at N={int(num):,} generated and {int(source.get('fid_num_real', num)):,} real images"
    lines = ["## FID / KID", "", f"{scores}, features: `{source.get('feature_extractor', 'not recorded')}`."]
    if source.get("feature_extractor_trained") is False:
        lines.append("The feature network is untrained (randomly initialised): its FIDs say little about quality; "
                     "pass --inception_weights or --fid_feature_model_dir.")
    lines += ["An FID compares only with FIDs from the same extractor and the same N (it is biased upward by a "
              "term that shrinks with N; raise N with --fid_num_samples); KID is unbiased. The Keras ImageNet "
              "InceptionV3 extractor is not the Inception graph published FIDs use.", ""]
    return lines
