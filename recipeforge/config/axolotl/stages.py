"""Axolotl's stage keys as recipe keys: `rl:` and `reward_model:` choose the stage, the `rl_*`/`dpo_*`/`trl:` keys
its settings (DPO, IPO, ORPO, KTO, CPO/SimPO, GRPO)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import math

from recipeforge.config.axolotl.values import num

if TYPE_CHECKING:
    from recipeforge.config.axolotl.conversion import Conversion

RL_STAGES = {"dpo": "dpo", "ipo": "dpo", "grpo": "grpo", "orpo": "orpo", "kto": "kto", "simpo": "cpo", "cpo": "cpo"}
DPO_LOSSES = ("sigmoid", "hinge", "ipo", "robust", "bco_pair", "sppo_hard", "nca_pair", "apo_zero", "apo_down")
GRPO_LOSSES = ("grpo", "dr_grpo", "dapo", "bnpo")
# Linear layers of decoder blocks that peft's all-linear reaches (Axolotl's find_all_linear_names finds them too).


def stage(conv: Conversion) -> None:
    """`rl:` (dpo, ipo, grpo, orpo, kto, simpo, cpo; others reported), the KD plugin (`distill`), or
    pretrain/sft from the data."""
    from recipeforge.config.axolotl import distill

    if distill.stage(conv) or _reward_model(conv):
        return
    rl = conv.get("rl")
    if rl is not None:
        rl = str(rl).lower()
        if rl in RL_STAGES:
            conv.put("stage", RL_STAGES[rl], "rl")
            if rl == "ipo":
                conv.put("dpo.loss_type", "ipo", "rl")
            elif rl == "simpo":  # Axolotl trains SimPO on TRL's CPOTrainer, as recipeforge does
                conv.put("cpo.loss_type", "simpo", "rl")
            return
        conv.put("stage", "dpo")
        conv.note("rl", f"'{rl}' has no counterpart (recipeforge's preference stages are dpo, orpo, kto and cpo); "
                        f"converted to stage dpo with the sigmoid loss on the same data")
        return
    from recipeforge.config.axolotl.datasets import raw_text_only

    if conv.get("pretraining_dataset") or raw_text_only(conv):
        conv.recipe["stage"] = "pretrain"
    else:
        conv.recipe["stage"] = "sft"


def _reward_model(conv: Conversion) -> bool:
    """`reward_model: true` (with `type_of_model` / `model_type: AutoModelForSequenceClassification` and
    `num_labels: 1`): a Bradley-Terry reward model, `stage: reward`."""
    flag = conv.get("reward_model")
    if flag is None:
        return False
    if flag is not True:
        conv.map("reward_model", "(false: not a reward model)")
        return False
    conv.put("stage", "reward", "reward_model")
    for src in ("type_of_model", "model_type"):
        if conv.get(src) is not None:
            if str(conv.get(src)) == "AutoModelForSequenceClassification":
                conv.map(src, "stage (reward loads AutoModelForSequenceClassification with one output)")
            else:
                conv.note(src, f"'{conv.get(src)}': the reward stage loads AutoModelForSequenceClassification")
    labels = conv.get("num_labels")
    if labels == 1:
        conv.map("num_labels", "stage (one score per sequence)")
    elif labels is not None:
        conv.note("num_labels", f"{labels}: a Bradley-Terry reward model has one output; converted with one")
    if conv.get("rl") is not None:
        conv.note("rl", f"'{conv.get('rl')}' is not used: reward_model: true trains a reward model (stage reward)")
    return True


def stage_settings(conv: Conversion) -> None:
    """DPO, GRPO, ORPO, KTO and CPO settings (`rl_beta`, `dpo_*`, `orpo_alpha`, `kto_*`, `simpo_gamma`, `trl:`)."""
    st = conv.recipe["stage"]
    trl = conv.get("trl") or {}
    if not isinstance(trl, dict):
        conv.note("trl", "not a mapping; not converted")
        trl = {}
    if trl:
        conv.map("trl", f"{st}.*" if st in ("dpo", "grpo", "orpo", "kto", "cpo") else "(see the trl.* lines)")
    beta = conv.get("rl_beta", trl.get("beta"))
    if st == "dpo":
        if conv.get("rl_beta") is not None:
            conv.put("dpo.beta", num(beta, float, "rl_beta"), "rl_beta")
        elif "beta" in trl:
            conv.put("dpo.beta", num(beta, float, "trl.beta"), "trl.beta")
        if conv.get("dpo_label_smoothing") is not None:
            conv.put("dpo.label_smoothing", num(conv.get("dpo_label_smoothing"), float, "dpo_label_smoothing"), "dpo_label_smoothing")
        if conv.get("rpo_alpha") is not None:
            conv.put("dpo.rpo_alpha", num(conv.get("rpo_alpha"), float, "rpo_alpha"), "rpo_alpha")
        if conv.get("max_prompt_len") is not None:
            conv.put("dpo.max_prompt_length", num(conv.get("max_prompt_len"), int, "max_prompt_len"), "max_prompt_len")
        losses = conv.get("dpo_loss_type")
        if losses is not None:
            losses = [losses] if isinstance(losses, str) else list(losses)
            if len(losses) == 1 and losses[0] in DPO_LOSSES:
                conv.put("dpo.loss_type", losses[0], "dpo_loss_type")
            else:
                conv.note("dpo_loss_type", f"{losses}: recipeforge takes one of {', '.join(DPO_LOSSES)}; the "
                                           f"recipe keeps {conv.recipe.get('dpo', {}).get('loss_type', 'sigmoid')}")
    elif st == "grpo":
        _grpo(conv, trl)
    elif st in ("orpo", "kto", "cpo"):
        _preference(conv, st, trl)
    for key in trl:
        full = f"trl.{key}"
        if full not in conv.mapped and full not in conv.notes:
            conv.note(full, f"no counterpart for stage {st}; not converted")
    for src in ("orpo_alpha", "simpo_gamma", "cpo_alpha", "kto_desirable_weight", "kto_undesirable_weight",
                "dpo_use_weighting", "dpo_padding_free", "dpo_use_liger_kernel", "dpo_loss_weights", "dpo_norm_loss"):
        if conv.get(src) is not None and src not in conv.mapped and src not in conv.notes:
            conv.note(src, f"not a setting of stage {st}; not converted")
    if st != "dpo":
        for src in ("rl_beta", "dpo_label_smoothing", "dpo_loss_type", "rpo_alpha"):
            if conv.get(src) is not None and src not in conv.mapped:
                conv.note(src, f"a DPO setting in a stage {st} config; not converted")


def _preference(conv: Conversion, st: str, trl: dict) -> None:
    """ORPO, KTO and CPO/SimPO settings. Axolotl takes beta from trl.beta, else rl_beta, else orpo_alpha."""
    sources = [("trl.beta", trl.get("beta")), ("rl_beta", conv.get("rl_beta")), ("orpo_alpha", conv.get("orpo_alpha"))]
    given = [(src, value) for src, value in sources if value is not None]
    for i, (src, value) in enumerate(given):
        if i == 0:
            conv.put(f"{st}.beta", num(value, float, src), src)
        else:
            conv.note(src, f"Axolotl takes beta from {given[0][0]} first; not converted")
    settings = {"kto": (("kto_desirable_weight", "desirable_weight"), ("kto_undesirable_weight", "undesirable_weight")),
                "cpo": (("simpo_gamma", "simpo_gamma"), ("cpo_alpha", "cpo_alpha"))}.get(st, ())
    for src, dst in settings:
        if conv.get(src) is not None:
            conv.put(f"{st}.{dst}", num(conv.get(src), float, src), src)
    if st == "cpo" and conv.get("cpo_alpha") is None and str(conv.get("rl")).lower() == "simpo":
        conv.put("cpo.cpo_alpha", 1.0)
        conv.note("rl", "simpo: Axolotl keeps TRL's NLL term on chosen answers (cpo_alpha 1.0) unless cpo_alpha is "
                        "set, so the recipe sets cpo.cpo_alpha: 1.0 (0, recipeforge's SimPO default, is the SimPO "
                        "paper's loss)")
    if conv.get("max_prompt_len") is not None:
        if st == "cpo":
            conv.note("max_prompt_len", "Axolotl does not cut SimPO/CPO prompts by it; not converted")
        else:
            conv.put(f"{st}.max_prompt_length", num(conv.get("max_prompt_len"), int, "max_prompt_len"),
                     "max_prompt_len")


def _grpo(conv: Conversion, trl: dict) -> None:
    g = "grpo"
    for src, dst, cast in (("beta", "beta", float), ("num_generations", "num_generations", int),
                           ("max_completion_length", "max_completion_length", int),
                           ("temperature", "temperature", float), ("top_p", "top_p", float),
                           ("epsilon", "epsilon", float)):
        if trl.get(src) is not None:
            conv.put(f"{g}.{dst}", num(trl[src], cast, f"trl.{src}"), f"trl.{src}")
    if conv.get("max_prompt_len") is not None:
        conv.put(f"{g}.max_prompt_length", num(conv.get("max_prompt_len"), int, "max_prompt_len"), "max_prompt_len")
    if trl.get("loss_type") is not None:
        if trl["loss_type"] in GRPO_LOSSES:
            conv.put(f"{g}.loss_type", trl["loss_type"], "trl.loss_type")
        else:
            conv.note("trl.loss_type", f"'{trl['loss_type']}' has no counterpart; the recipe uses dapo")
    if trl.get("scale_rewards") is not None:
        conv.put(f"{g}.scale_rewards", "group" if trl["scale_rewards"] else "none", "trl.scale_rewards")
    if trl.get("use_vllm"):
        conv.note("trl.use_vllm", "generation uses the hf engine; install recipeforge-vllm and set "
                                  "grpo.rollout.engine: vllm for vLLM")
    funcs = trl.get("reward_funcs") or []
    weights = trl.get("reward_weights") or []
    rewards = []
    for i, ref in enumerate(funcs):
        module, _, func = str(ref).rpartition(".")
        entry = {"name": f"{module}:{func}" if module else str(ref)}
        if i < len(weights):
            entry["weight"] = num(weights[i], float, f"trl.reward_weights[{i}]")
        rewards.append(entry)
    if rewards:
        conv.put(f"{g}.rewards", rewards, "trl.reward_funcs")
        # No allow_code here: importing code named in a recipe stays the user's explicit decision.
        conv.note("trl.reward_funcs", "written as module:function code references, which recipeforge imports "
                                      "only after an explicit opt-in: review that code, then pass --trust-code "
                                      "or set allow_code: true; recipeforge calls them with prompts, completions "
                                      "and the row's other columns as keywords")
        if weights:
            conv.map("trl.reward_weights", f"{g}.rewards[*].weight")
    else:
        conv.put(f"{g}.rewards", [{"name": "length"}])
        conv.note("trl.reward_funcs", "none given; the recipe uses the built-in `length` reward as a placeholder "
                                      "(replace it with accuracy, exact_match, regex or your own)")
    n = conv.recipe[g].get("num_generations", 8)
    gbs = conv.recipe.get("train", {}).get("global_batch_size", 32)
    if gbs % n:
        fixed = n * max(1, math.ceil(gbs / n))
        conv.put("train.global_batch_size", fixed)
        conv.note("num_generations" if "trl.num_generations" not in conv.mapped else "trl.num_generations",
                  f"GRPO needs a global batch divisible by {n}: train.global_batch_size raised from {gbs} to {fixed}")
