"""Path-star graphs (Bachmann & Nagarajan 2024, "The pitfalls of next-token prediction").

A graph has a centre node and `degree` arms; each arm is a path of `path_len` nodes that
starts at the centre (the paper's path length: the answer has `path_len` nodes, the centre
included), so a graph has 1 + degree·(path_len − 1) distinct node ids drawn from
[0, num_nodes). Edges point away from the centre.

An example, as symbols (one token each):

    u v | u v | … | / start goal = start … goal

the edge list in a random order (each edge `u v |`), `/`, the query (start = the centre,
goal = the leaf of one arm), `=`, and the answer: the path from start to goal. Next-token
training can learn the "Clever Hans" shortcut (copy the edge whose source is the last answer
node) for every node but the first after the centre, which is the whole difficulty: it needs
a plan, the arm that ends at the goal.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lab.data.synthetic.example import AnswerTask, Example
from lab.errors import require

EDGE_END, QUERY, ANSWER = "|", "/", "="


@dataclass(frozen=True)
class StarGraphTask(AnswerTask):
    degree: int = 2
    path_len: int = 5
    num_nodes: int = 50

    @property
    def n_graph_nodes(self) -> int:
        return 1 + self.degree * (self.path_len - 1)

    # The decision of an answer: its second token, the first arm node after the centre (the
    # centre itself is copied from the query). A model that never learned to plan picks an arm
    # at random there, so it is right with probability 1/degree.
    decision_index = 1

    @property
    def decision_choices(self) -> int:
        return self.degree

    def check_bounds(self) -> None:
        require(self.degree >= 2, "data.degree", f"must be an integer ≥ 2 (one arm is no choice), got {self.degree!r}")
        require(self.path_len >= 2, "data.path_len", f"must be an integer ≥ 2 (the centre and a leaf), got {self.path_len!r}")
        require(
            self.num_nodes >= self.n_graph_nodes,
            "data.num_nodes",
            f"must be ≥ 1 + degree·(path_len − 1) = {self.n_graph_nodes} (distinct ids per graph), got {self.num_nodes!r}",
        )

    def symbols(self) -> list[str]:
        return [str(node) for node in range(self.num_nodes)] + [EDGE_END, QUERY, ANSWER]

    def sample(self, rng: np.random.Generator) -> Example:
        nodes = rng.choice(self.num_nodes, size=self.n_graph_nodes, replace=False)  # [1 + d·(l−1)] distinct ids
        centre = int(nodes[0])
        arms = nodes[1:].reshape(self.degree, self.path_len - 1)  # [d, l−1]: arm a's nodes outward from the centre
        edges = []
        for arm in arms.tolist():
            path = [centre, *arm]
            edges += list(zip(path[:-1], path[1:]))
        order = rng.permutation(len(edges))  # the shuffled edge list
        edges = [edges[i] for i in order]
        goal_arm = int(rng.integers(self.degree))
        answer = [centre, *arms[goal_arm].tolist()]
        prompt = [s for u, v in edges for s in (str(u), str(v), EDGE_END)]
        prompt += [QUERY, str(centre), str(answer[-1]), ANSWER]
        # The same graph and query with another edge order is the same problem: it keys the train/val split.
        key = (frozenset(edges), centre, answer[-1])
        return Example(prompt=tuple(prompt), answer=tuple(str(node) for node in answer), key=key)


