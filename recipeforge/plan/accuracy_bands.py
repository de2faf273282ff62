"""The accuracy band of each class of estimate (`recipeforge.plan.accuracy.band_class`): the
90% nearest-rank percentile of |published / estimate - 1| over the published figures of that class
(tests/plan/published/ and published_heldout/, the excluded ones left out), rounded up to a whole percent.

Written by `python bench/plan_calibration.py --write-bands`; tests/plan/test_accuracy_bands.py fails when
it no longer matches the figures. Not edited by hand.
"""

BANDS = {'calibrated': 0.17, 'sharded': 0.19}
FIGURES = {'calibrated': 15, 'sharded': 30}  # how many published figures each band rests on
# A class no published figure covers (Megatron, GRPO generation, MoE): the widest measured band plus
# five points, and never under 25%; a stated margin, not a measurement.
UNCALIBRATED = 0.25
