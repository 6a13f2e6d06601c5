"""Draft trees (docs/decoding.md): topology, the typed proposal buffer, candidates (path statistics: lab.decode_core.ledger).

A tree is a set of root-to-leaf paths of candidate *ranks*: path (0, 2, 1) takes the best
candidate at draft position 1, the third at position 2 and the second at position 3.
Independent heads propose one ranked candidate list per draft position (the top b_j by
the head's logits when greedy; b_j draws without replacement from the head's distribution
when sampling), so the candidates of one position are shared by every parent (Medusa's
Cartesian tree). Widths [4, 3, 2] are all 24 paths of ranks < (4, 3, 2): 40 nodes.

Node 0 is the root, the frontier token (emitted, not yet in the target cache); nodes
1.. are drafts in breadth-first order, each after its parent. Every node's children must
be ranks 0..c−1: the recursive rejection of multi-candidate sampling visits siblings in
the order they were drawn, and a gap in the ranks would skip a draw it conditions on.
A chain of m drafts is the tree of widths [1] * m.
"""

from __future__ import annotations

import functools
import heapq
import itertools
from dataclasses import dataclass
from functools import cached_property

import torch

from lab.errors import ConfigError, is_int


@dataclass(frozen=True)
class TreeShape:
    """Static topology: per node its parent, draft position (depth) and candidate rank (node 0 = root)."""

    parents: tuple[int, ...]
    depths: tuple[int, ...]
    ranks: tuple[int, ...]

    @staticmethod
    def chain(m: int) -> "TreeShape":
        return _chain(m)

    @staticmethod
    def from_widths(widths) -> "TreeShape":
        return TreeShape.from_paths(list(itertools.product(*(range(w) for w in widths))))

    @staticmethod
    def from_paths(paths) -> "TreeShape":
        prefixes = sorted({tuple(path[:j]) for path in paths for j in range(len(path) + 1)}, key=lambda p: (len(p), p))  # BFS order
        node = {prefix: i for i, prefix in enumerate(prefixes)}  # () is node 0
        parents = tuple(node[p[:-1]] if p else -1 for p in prefixes)
        shape = TreeShape(parents, tuple(len(p) for p in prefixes), tuple(p[-1] if p else 0 for p in prefixes))
        for i, kids in enumerate(shape.children):
            ranks = [shape.ranks[c] for c in kids]
            if ranks != list(range(len(ranks))):
                raise ConfigError("tree", f"the children of node {prefixes[i]} have ranks {ranks}; every node's children must be ranks 0..c-1")
        return shape

    @property
    def size(self) -> int:
        """Nodes including the root."""
        return len(self.parents)

    @property
    def depth(self) -> int:
        return max(self.depths)

    @cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        """Per node, its children in rank order."""
        kids: list[list[int]] = [[] for _ in self.parents]
        for i, parent in enumerate(self.parents[1:], start=1):
            kids[parent].append(i)
        return tuple(tuple(sorted(k, key=lambda c: self.ranks[c])) for k in kids)

    @cached_property
    def widths(self) -> tuple[int, ...]:
        """Candidates needed per draft position 1..depth (the highest rank used + 1)."""
        return tuple(1 + max(r for r, d in zip(self.ranks, self.depths) if d == j) for j in range(1, self.depth + 1))

    @property
    def is_chain(self) -> bool:
        return all(len(k) <= 1 for k in self.children)

    @cached_property
    def rank_paths(self) -> tuple[tuple[int, ...], ...]:
        """Per node, the ranks from the root down to it."""
        paths: list[tuple[int, ...]] = [()]
        for i in range(1, self.size):
            paths.append(paths[self.parents[i]] + (self.ranks[i],))
        return tuple(paths)

    def ancestor_mask(self, device=None) -> torch.Tensor:
        """[n, n] bool: node i may attend to node j iff j is i or one of its ancestors."""
        mask = torch.eye(self.size, dtype=torch.bool)
        for i in range(1, self.size):
            mask[i] |= mask[self.parents[i]]  # BFS order: the parent's row is complete
        return mask.to(device)

    def limited(self, depth: int, widths: list[int] | None = None) -> "TreeShape":
        """The subtree of nodes at draft positions ≤ `depth` whose ranks stay below `widths[j-1]` (candidates available)."""
        keep = [p for p in self.rank_paths if len(p) <= depth and (widths is None or all(r < widths[j] for j, r in enumerate(p)))]
        return self if len(keep) == self.size else TreeShape.from_paths(keep)


@functools.lru_cache(maxsize=None)
def _chain(m: int) -> TreeShape:
    """One object per length: a round reuses its topology and everything cached on it (children, masks)."""
    return TreeShape.from_paths([(0,) * m]) if m else TreeShape((-1,), (0,), (0,))


def tree_for_budget(agreement: list[float], nodes: int) -> TreeShape:
    """The draft tree of at most `nodes` candidates with the largest expected accepted length (Medusa's calibration).

    agreement[j]: the measured top-1 agreement of the head at draft position j + 1 (the run's
    `val/agree/h{j+2}`). Assumed: rank r at position j is right with probability a_j (1 − a_j)^r
    (the measured top-1 rate, geometric below it) and positions are independent, so a node's
    value is the product along its path and the expected accepted length is the sum over nodes.
    Nodes are added best-first; a node's next sibling or first child becomes a candidate only
    once it is in, so the tree stays rank-closed.
    """
    agreement = [min(max(a, 1e-6), 1 - 1e-6) for a in agreement]  # a value of 0 would stop the product updates below
    value = lambda j, r: agreement[j] * (1.0 - agreement[j]) ** r  # noqa: E731
    paths, frontier = [], [(-value(0, 0), (0,))]
    while frontier and len(paths) < nodes:
        negative, path = heapq.heappop(frontier)
        paths.append(path)
        j = len(path) - 1
        heapq.heappush(frontier, (negative / value(j, path[-1]) * value(j, path[-1] + 1), path[:-1] + (path[-1] + 1,)))  # next sibling
        if j + 1 < len(agreement):
            heapq.heappush(frontier, (negative * value(j + 1, 0), path + (0,)))  # first child
    return TreeShape.from_paths(paths)


def tree_shape(spec) -> TreeShape:
    """`[4, 3, 2]` (widths per draft position) or `[(0,), (0, 1), (1, 0)]` (rank paths) -> TreeShape."""
    if isinstance(spec, TreeShape):
        return spec
    allowed = "a list of widths per draft position (e.g. [4, 3, 2]) or a list of root-to-leaf rank paths (e.g. [[0, 0], [0, 1], [1]])"
    if not isinstance(spec, (list, tuple)) or not spec:
        raise ConfigError("tree", f"must be {allowed}, got {spec!r}")
    if all(is_int(w) for w in spec):
        if any(w < 1 for w in spec):
            raise ConfigError("tree", f"widths must be integers ≥ 1, got {list(spec)}")
        return TreeShape.from_widths(spec)
    if all(isinstance(p, (list, tuple)) and p and all(is_int(r) and r >= 0 for r in p) for p in spec):
        return TreeShape.from_paths([tuple(p) for p in spec])
    raise ConfigError("tree", f"must be {allowed}, got {spec!r}")


NGRAM_HORIZON = -1  # `horizons` entry of a node that prompt lookup proposed (no head)


@dataclass
class ProposalBuffer:
    """One round's candidates: what the target verifies and acceptance needs, nothing committed."""

    prefix_version: int  # committed target rows the proposal was made after
    shape: TreeShape
    tokens: list[int]  # per node; node 0 is the frontier
    horizons: list[int]  # per node, the horizon whose head proposed it (0 for the frontier, NGRAM_HORIZON for prompt lookup)
    candidate_probs: list[torch.Tensor | None]  # per draft position j: [b_j, V] float64, the law rank r was drawn from (None: greedy)
    draft_logits: torch.Tensor | None  # [depth, V] the heads' logits per draft position (greedy scores come from them)
    head_identity: str  # which head (and weights) proposed
    vocab_identity: str  # the vocabulary the token ids index
    point_masses: frozenset[int] = frozenset()  # nodes proposed deterministically (prompt lookup): their law is all mass on their token

    @property
    def parents(self) -> tuple[int, ...]:
        return self.shape.parents

    @property
    def scores(self) -> list[float]:
        """Per node, the draft log-probability of its token (0 for the frontier): under the law it was drawn from
        when sampling, under the head's softmax when greedy. Computed on request: a round never needs it."""
        out = [0.0]
        for node in range(1, self.shape.size):
            j, rank, token = self.shape.depths[node] - 1, self.shape.ranks[node], self.tokens[node]
            law = self.candidate_probs[j]
            if node in self.point_masses:
                out.append(0.0)
            elif law is not None:
                out.append(float(law[rank, token].log()))
            elif self.draft_logits is not None:
                out.append(float(self.draft_logits[j].double().log_softmax(-1)[token]))
            else:
                out.append(float("nan"))
        return out

    def path_tokens(self, path: list[int]) -> list[int]:
        return [self.tokens[node] for node in path]

    def law(self, node: int) -> torch.Tensor | None:
        """[V] float64 law node's token was drawn from when sampling; None for a point mass (a deterministic proposal)."""
        if node in self.point_masses:
            return None
        return self.candidate_probs[self.shape.depths[node] - 1][self.shape.ranks[node]]

    def pruned(self, keep) -> "ProposalBuffer":
        """Only the nodes of `keep` (the root always) whose ancestors and lower-ranked siblings are kept too: a rank-closed
        subtree (recursive rejection visits a node's children in draw order, so a kept rank needs every rank before it)."""
        wanted, kept = set(keep) | {0}, {0}
        for node in range(1, self.shape.size):  # breadth-first: parents and lower-ranked siblings come first
            parent = self.shape.parents[node]
            before = [c for c in self.shape.children[parent] if self.shape.ranks[c] < self.shape.ranks[node]]
            if node in wanted and parent in kept and all(c in kept for c in before):
                kept.add(node)
        if len(kept) == self.shape.size:
            return self
        paths = [self.shape.rank_paths[i] for i in sorted(kept) if i]
        shape = TreeShape.from_paths(paths) if paths else TreeShape.chain(0)
        old = {self.shape.rank_paths[i]: i for i in kept}
        nodes = [old[path] for path in shape.rank_paths]  # new node -> old node
        return ProposalBuffer(self.prefix_version, shape, [self.tokens[i] for i in nodes], [self.horizons[i] for i in nodes],
                              self.candidate_probs[: shape.depth], self.draft_logits, self.head_identity, self.vocab_identity,
                              frozenset(new for new, i in enumerate(nodes) if i in self.point_masses))

    def graft(self, chain: list[int]) -> "ProposalBuffer":
        """This tree with the deterministic `chain` of tokens after the root merged in as a trie.

        The chain follows existing nodes while their tokens match, then leaves as a new branch: its first
        node is the last-ranked child of the node where they part, so recursive rejection tries it only
        after every drawn candidate there (a point mass after those draws keeps the sampling law exact).
        """
        node, depth = 0, 0
        while depth < len(chain):
            match = [c for c in self.shape.children[node] if self.tokens[c] == chain[depth]]
            if not match:
                break
            node, depth = match[0], depth + 1
        if depth == len(chain):
            return self
        branch = self.shape.rank_paths[node] + (len(self.shape.children[node]),) + (0,) * (len(chain) - depth - 1)
        new = {branch[: len(branch) - i]: chain[len(chain) - 1 - i] for i in range(len(chain) - depth)}  # rank path -> token
        known = dict(zip(self.shape.rank_paths, self.tokens))
        shape = TreeShape.from_paths([*self.shape.rank_paths[1:], branch])
        tokens = [known.get(p, new.get(p)) for p in shape.rank_paths]
        old_masses = {self.shape.rank_paths[i] for i in self.point_masses}
        masses = frozenset(i for i, p in enumerate(shape.rank_paths) if p in new or p in old_masses)
        horizons = [0 if i == 0 else (NGRAM_HORIZON if i in masses else depth_ + 1) for i, depth_ in enumerate(shape.depths)]
        laws = self.candidate_probs + [None] * (shape.depth - len(self.candidate_probs))
        return ProposalBuffer(self.prefix_version, shape, tokens, horizons, laws, self.draft_logits, self.head_identity + " + prompt lookup",
                              self.vocab_identity, masses)


def ranked_candidates(logits: torch.Tensor, widths, chooser, vocab_limited: bool = False) -> tuple[list[list[int]], list[torch.Tensor | None]]:
    """Per draft position j, `widths[j]` ranked candidates from the head's logits [m, V], and the laws they were drawn from.

    Greedy: the top b_j token ids (with `vocab_limited`, never one at −inf: outside a draft vocabulary). Sampling: b_j draws without replacement; draw r comes
    from the head's distribution with draws 0..r−1 removed and renormalised, and that law
    is kept ([b_j, V]) for the acceptance ratio. Fewer candidates come back when the
    distribution's support (e.g. under top_k) runs out.
    """
    m = len(widths)
    if chooser.greedy:
        top = logits[:m].topk(min(max(widths), logits.shape[-1]), dim=-1)  # [m, b_max]
        if not vocab_limited:  # every id has a finite logit: no filtering op in the round
            return [row[:w] for row, w in zip(top.indices.tolist(), widths)], [None] * m  # one host sync
        ids = torch.where(top.values > float("-inf"), top.indices, -1).tolist()  # one host sync; −1: an id a draft vocabulary excludes
        return [[t for t in row if t >= 0][:w] for row, w in zip(ids, widths)], [None] * m
    probs = chooser.probs(logits[:m])  # [m, V] float64
    if max(widths) == 1:  # a chain: one draw per position from the head's law (a law always has support)
        return [[chooser.draws.sample(probs[j])] for j in range(m)], [probs[j : j + 1] for j in range(m)]  # laws [1, V]
    support = (probs > 0).sum(-1).tolist()  # [m]: tokens a draw can still reach (one host sync)
    tokens, laws = [], []
    for j, width in enumerate(widths):
        q, drawn, law = probs[j], [], []
        for _ in range(min(width, support[j])):
            if drawn:  # the law of the next draw: the previous draw removed, renormalised (mass is left: fewer draws than support)
                q = q.clone()
                q[drawn[-1]] = 0.0
                q = q / q.sum()  # [V]
            drawn.append(chooser.draws.sample(q)), law.append(q)
        tokens.append(drawn), laws.append(torch.stack(law))  # law [b_j, V]
    return tokens, laws


def build_buffer(shape: TreeShape, frontier: int, candidates, laws, draft_logits, version: int, head: str, vocab: str) -> ProposalBuffer:
    """Place ranked candidates (per position) on the nodes of `shape`, pruned to the candidates available."""
    shape = shape.limited(shape.depth, [len(c) for c in candidates])
    tokens = [frontier, *(candidates[depth - 1][rank] for depth, rank in zip(shape.depths[1:], shape.ranks[1:]))]
    horizons = [0, *(depth + 1 for depth in shape.depths[1:])]
    return ProposalBuffer(version, shape, tokens, horizons, laws[: shape.depth], draft_logits, head, vocab)