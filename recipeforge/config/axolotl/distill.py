"""Axolotl's knowledge-distillation plugin (`axolotl.integrations.kd`) as the recipe's `distill:` section.

With the plugin listed in `plugins:` and `kd_trainer` on, Axolotl trains the student against a teacher's
top-k log-probabilities: read from a dataset column (dataset type `axolotl.integrations.kd.chat_template`,
`logprobs_field`) or fetched per batch from a served teacher (`kd_online_server_base_url`). recipeforge
computes the teacher's log-probs during training, from a colocated teacher (`distill.teacher.name_or_path`)
or a served one (`distill.teacher.url`), so a config whose log-probs are precomputed must name its teacher:
the converted recipe then leaves `distill.teacher` empty, and validation stops there until it is named.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from recipeforge.config.axolotl.values import num

if TYPE_CHECKING:
    from recipeforge.config.axolotl.conversion import Conversion

KD_PLUGIN = "axolotl.integrations.kd.KDPlugin"
KD_DATASET = "axolotl.integrations.kd.chat_template"
# KD keys without a counterpart, with the reason (older Axolotl releases had the last three)
UNMAPPED = {
    "kd_normalize_topk": "Axolotl renormalises the teacher's top-k log-probs to sum to one; recipeforge keeps them "
                         "as they are and adds the rest of the vocabulary as one more bucket, so the divergence "
                         "covers the whole distribution; no switch",
    "kd_temperature_min": "no temperature schedule: distill.temperature is fixed for the run (Axolotl decays the "
                          "online teacher's temperature from kd_temperature to kd_temperature_min over the steps)",
    "kd_zscore_base_temp": "no z-score normalisation of the teacher's logits; distill.temperature scales both "
                           "distributions alike",
    "kd_use_dynamic_temp": "no dynamic temperature; distill.temperature is fixed for the run",
    "kd_top_k_before_softmax": "recipeforge takes the top-k of the teacher's log-softmax over the whole vocabulary "
                               "(after the softmax), with the rest as one bucket",
    "kd_cache_dir": "no cache of a served teacher's answers; it scores every batch",
}


def enabled(conv: Conversion) -> bool:
    """Whether Axolotl distills: the KD plugin is listed and `kd_trainer` is on."""
    return KD_PLUGIN in _plugins(conv) and bool(conv.get("kd_trainer"))


def stage(conv: Conversion) -> bool:
    """Choose `stage: distill` when Axolotl distills; True when it did."""
    plugins = _plugins(conv)
    if KD_PLUGIN in plugins:
        other = [p for p in plugins if p != KD_PLUGIN]
        conv.map("plugins", "stage (the KD plugin: distill)" if conv.get("kd_trainer") else
                 "(the KD plugin without kd_trainer: Axolotl trains without distillation)")
        if other:
            conv.note("plugins", f"{', '.join(other)}: Axolotl plugins have no counterpart; not converted")
    if not enabled(conv):
        if conv.config.get("kd_trainer") is False:
            conv.map("kd_trainer", "(off: no distillation)")
        elif conv.get("kd_trainer"):
            conv.note("kd_trainer", f"without {KD_PLUGIN} in plugins Axolotl does not distill; converted without "
                                    "distillation")
        return False
    conv.put("stage", "distill", "kd_trainer")
    return True


def settings(conv: Conversion) -> None:
    """`distill:` from the kd_* keys (or, when the config does not distill, each of them reported)."""
    keys = [k for k in conv.config if k.startswith("kd_") and conv.config[k] is not None and k != "kd_trainer"]
    if conv.recipe.get("stage") != "distill":
        for key in keys:
            if key not in conv.notes:
                conv.note(key, "a knowledge-distillation setting, and this config does not distill (kd_trainer with "
                               f"{KD_PLUGIN}); not converted")
        return
    _teacher(conv)
    _loss(conv)
    for key in keys:
        if key not in conv.mapped and key not in conv.notes:
            conv.note(key, UNMAPPED.get(key, "a knowledge-distillation setting with no counterpart in recipeforge's "
                                             "distill stage; not converted"))


def dataset(conv: Conversion, entry: dict[str, Any], where: str) -> set[str]:
    """An `axolotl.integrations.kd.chat_template` entry beyond its chat fields: its precomputed log-probs
    are not read. Returns the entry keys this handled."""
    column = entry.get("logprobs_field") or "logprobs"
    conv.note(f"{where}.type", f"{KD_DATASET} reads the teacher's precomputed top-k log-probs from the column "
                               f"'{column}'; recipeforge computes the teacher's log-probs during training from "
                               "distill.teacher (colocated or served), so the rows train as chat messages and that "
                               "column is not read")
    if "logprobs_field" in entry:
        conv.map(f"{where}.logprobs_field", "(not read: the teacher scores during training)")
    if "temperature" in entry:
        conv.note(f"{where}.temperature", "the temperature the precomputed log-probs were sampled at; a teacher that "
                                          "scores during training has none (distill.temperature is the loss's)")
    return {"logprobs_field", "temperature"}


def _teacher(conv: Conversion) -> None:
    """The served teacher (`kd_online_*`), or an empty `distill.teacher` that validation names."""
    url = conv.get("kd_online_server_base_url")
    if url is None:
        conv.put("distill.teacher", {})
        conv.note("kd_trainer", "Axolotl distills from log-probs precomputed in the dataset; recipeforge computes "
                                "the teacher's log-probs during training, so name the teacher that produced them: "
                                "distill.teacher.name_or_path (loaded frozen on every GPU) or distill.teacher.url "
                                "(an OpenAI-compatible server, e.g. `vllm serve <teacher>`). distill.teacher is left "
                                "empty: the recipe fails validation there until it names one")
        for key in ("kd_online_topk", "kd_online_timeout", "kd_online_server"):
            if conv.get(key) is not None:
                conv.note(key, "a served-teacher setting without kd_online_server_base_url; not converted")
        return
    base = str(url).rstrip("/")
    conv.put("distill.teacher.url", base if base.endswith("/v1") else f"{base}/v1", "kd_online_server_base_url")
    if not base.endswith("/v1"):
        conv.note("kd_online_server_base_url", "Axolotl appends /v1/completions to the server's base URL; "
                                               "distill.teacher.url is the API base, so /v1 is added")
    server = str(conv.get("kd_online_server") or "vllm").lower()
    if server == "vllm":
        if conv.get("kd_online_server") is not None:
            conv.map("kd_online_server", "distill.teacher.url (vLLM's OpenAI-compatible completions API)")
    else:
        conv.note("kd_online_server", f"'{server}': recipeforge's served teacher is asked through an OpenAI-compatible "
                                      "completions API with prompt log-probs (`vllm serve`, `recipeforge serve`), "
                                      f"not {server}'s own; serve the teacher with vLLM for this recipe")
    if conv.get("kd_online_topk") is not None:
        k = num(conv.get("kd_online_topk"), int, "kd_online_topk")
        conv.put("distill.top_k", min(max(k, 1), 1024), "kd_online_topk")
        if not 1 <= k <= 1024:
            conv.note("kd_online_topk", f"{k}: distill.top_k takes 1 to 1024; converted as {min(max(k, 1), 1024)}")
    if conv.get("kd_online_timeout") is not None:
        conv.put("distill.teacher.timeout_s", num(conv.get("kd_online_timeout"), float, "kd_online_timeout"),
                 "kd_online_timeout")


def _loss(conv: Conversion) -> None:
    """Temperature, the CE/KD weights (as `sft_weight`) and `kd_beta` (the divergence)."""
    if conv.get("kd_temperature") is not None:
        conv.put("distill.temperature", num(conv.get("kd_temperature"), float, "kd_temperature"), "kd_temperature")
    ce = conv.get("kd_ce_alpha")
    kd = conv.get("kd_alpha")
    if ce is not None or kd is not None:
        ce_w = num(ce, float, "kd_ce_alpha") if ce is not None else 0.0
        kd_w = num(kd, float, "kd_alpha") if kd is not None else 1.0
        if ce_w + kd_w <= 0:
            conv.note("kd_ce_alpha" if ce is not None else "kd_alpha", "both loss weights are 0; not converted")
        else:
            weight = round(ce_w / (ce_w + kd_w), 6)
            source = "kd_ce_alpha" if ce is not None else "kd_alpha"
            conv.put("distill.sft_weight", weight, source)
            if ce is not None and kd is not None:
                conv.map("kd_alpha", "distill.sft_weight")
            scale = "" if abs(ce_w + kd_w - 1) < 1e-9 else (
                f"; Axolotl's loss is {ce_w + kd_w:g} times the recipe's, a constant factor Adam's updates hardly see")
            conv.note(source, f"distill.sft_weight = kd_ce_alpha / (kd_ce_alpha + kd_alpha) = {ce_w:g} / "
                              f"({ce_w:g} + {kd_w:g}) = {weight:g}: the recipe's loss is sft_weight x cross-entropy "
                              f"+ (1 - sft_weight) x the divergence{scale}")
    beta = conv.get("kd_beta")
    if beta is not None:
        b = num(beta, float, "kd_beta")
        if b == 0:
            conv.put("distill.loss", "forward_kl", "kd_beta")
        elif b == 1:
            conv.put("distill.loss", "reverse_kl", "kd_beta")
        elif 0 < b < 1:
            conv.put("distill.loss", "jsd", "kd_beta")
            conv.put("distill.beta", b, "kd_beta")
            conv.note("kd_beta", f"{b:g}: the generalized JSD with the mixture {b:g} x teacher + {1 - b:g} x student, "
                                 "as Axolotl's and GKD's")
        else:
            conv.note("kd_beta", f"{b:g}: Axolotl's kd_beta lies in [0, 1]; the recipe keeps forward_kl")


def _plugins(conv: Conversion) -> list[str]:
    value = conv.config.get("plugins") or []
    return [str(p) for p in (value if isinstance(value, list) else [value])]
