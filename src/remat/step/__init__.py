"""A training step: its budget, shared among its graphs (:mod:`remat.step.budget`), and each
graph's plan within its share (:mod:`remat.step.planner`). No torch: the partitioner captures
a graph, the step planner plans it, the partitioner lowers the plan."""
