"""A suffix automaton over the lookup's sources: the occurrence with the longest matching context.

`SuffixIndex(sources)` indexes the sources in order (held draft tail, earlier drafts, request),
joined by separators no token equals, so that no match spans two sources. Walking the answer
through the automaton gives, token by token, the longest suffix of the answer found anywhere in
the sources (SAM-decoding's match, amortised constant time per token), and each state keeps the
earliest position of its occurrences that has a token after it. So `continuation` returns what
followed the occurrence with the longest context, ties broken by source order then position
within the source, falling back to shorter contexts when the longest one ends a source.
"""

from __future__ import annotations


class JoinedSources:
    """The sources in order, each followed by a separator no token equals (so that no match
    spans two sources)."""

    def __init__(self, sources: list[list[int]]) -> None:
        self.text: list[int] = []
        for number, source in enumerate(sources):
            self.text += source
            self.text.append(-1 - number)  # separator: matches nothing, not even another separator

    def tokens_after(self, follow: int, limit: int) -> list[int]:
        """Up to `limit` tokens from position `follow`, ending with the source they are in.

        Args:
            follow (int): the position in the joined sources.
            limit (int): the most tokens to return.
        """
        tokens = []
        for token in self.text[follow : follow + limit]:
            if token < 0:  # the separator after the source
                break
            tokens.append(token)
        return tokens


class SuffixIndex(JoinedSources):
    """Suffix automaton of the sources' concatenation (states: longest length, suffix link,
    transitions, earliest end position with a following token)."""

    def __init__(self, sources: list[list[int]]) -> None:
        super().__init__(sources)
        self.nowhere = len(self.text)  # first_live of a state no token follows
        self.length, self.link, self.next = [0], [-1], [{}]
        self.first_live = [self.nowhere]
        created_at: list[int | None] = [None]
        last = 0
        for position, token in enumerate(self.text):
            last = self._extend(last, token, position, created_at)
        self._propagate_first_live(created_at)

    def _new_state(self, length: int, link: int, transitions: dict[int, int], created_at: list[int | None],
                   position: int | None) -> int:
        self.length.append(length)
        self.link.append(link)
        self.next.append(transitions)
        self.first_live.append(self.nowhere)
        created_at.append(position)
        return len(self.length) - 1

    def _extend(self, last: int, token: int, position: int, created_at: list[int | None]) -> int:
        """The standard online construction step: the state of the whole text so far."""
        current = self._new_state(self.length[last] + 1, -1, {}, created_at, position)
        state = last
        while state != -1 and token not in self.next[state]:
            self.next[state][token] = current
            state = self.link[state]
        if state == -1:
            self.link[current] = 0
            return current
        target = self.next[state][token]
        if self.length[state] + 1 == self.length[target]:
            self.link[current] = target
            return current
        clone = self._new_state(self.length[state] + 1, self.link[target], dict(self.next[target]), created_at, None)
        while state != -1 and self.next[state].get(token) == target:
            self.next[state][token] = clone
            state = self.link[state]
        self.link[target] = self.link[current] = clone
        return current

    def _propagate_first_live(self, created_at: list[int | None]) -> None:
        """A state's end positions are those of the non-clone states below it in the suffix-link
        tree; keep the earliest that a real token follows (not a separator)."""
        for state, position in enumerate(created_at):
            if position is not None and position + 1 < len(self.text) and self.text[position + 1] >= 0:
                self.first_live[state] = position
        for state in sorted(range(1, len(self.length)), key=self.length.__getitem__, reverse=True):
            parent = self.link[state]
            self.first_live[parent] = min(self.first_live[parent], self.first_live[state])

    def step(self, state: int, matched: int, token: int) -> tuple[int, int]:
        """The state and match length after the answer grows by `token`.

        Args:
            state (int): the automaton's state.
            matched (int): the current match's length.
            token (int): the answer's new token.
        """
        while state and token not in self.next[state]:
            state = self.link[state]
            matched = self.length[state]
        if token in self.next[state]:
            return self.next[state][token], matched + 1
        return 0, 0

    def continuation(self, state: int, matched: int, min_context: int) -> tuple[int, int]:
        """(position after the chosen occurrence, context length): the longest context of at
        least `min_context` tokens with a token after it; (-1, 0) when there is none.

        Args:
            state (int): the automaton's state.
            matched (int): the current match's length.
            min_context (int): the shortest context that counts.
        """
        while matched >= min_context and state:
            if self.first_live[state] < self.nowhere:
                return self.first_live[state] + 1, matched
            state = self.link[state]
            matched = self.length[state]
        return -1, 0
