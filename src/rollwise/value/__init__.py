"""Predicting a prompt's pass rate before generating it (issue #31): a state-zero predictor
trained online on observed group pass rates (:mod:`rollwise.value.predictor`) and the measures of
how good its predictions are (:mod:`rollwise.value.metrics`)."""
