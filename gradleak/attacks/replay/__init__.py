"""Replay of the client's update on candidate data: the differentiable simulator and the distances
(matching), its cheaper exact paths (double_backward, finite_difference, factored, head_unroll,
epoch_replay) and label recovery from the head's gradient (labels). Imports no other attack family."""
