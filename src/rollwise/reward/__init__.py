"""Rewards after verification (config section ``[reward]``, metrics ``reward/*``): shaping
(``shaping``: DAPO overlong penalty, KL in the reward, FAPO's penalty term), TTRL's
majority-vote pseudo-rewards (``ttrl``, metrics ``ttrl/*``) and FAPO's flaw detector
(``fapo``, metrics ``fapo/*``). ``from rollwise import reward; reward.shape(...)`` reads
``shaping``'s public names from here."""

from rollwise.reward.shaping import overlong_limits, reference_kl, sequence_kl, shape

__all__ = ["overlong_limits", "reference_kl", "sequence_kl", "shape"]
