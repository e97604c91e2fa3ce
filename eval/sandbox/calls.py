"""Tests in a trusted process, the program's functions in the sandbox.

`run_calls` starts two processes per program: the sandbox, where the program's
code runs and then serves calls of its functions, and a checker, a plain Python
process of ours that runs the benchmark's own test code with each of the
program's functions replaced by a proxy. A proxy sends the call's arguments to
the sandbox and returns what comes back, with its type (eval/sandbox/codec.py):
the checker never runs model-written code, and builds only builtin, standard-library
and numpy values; an object of the program's own class stays in the sandbox, and the
checker holds a stand-in (`Remote`) whose every operation is a question to the
program, a comparison with a plain value checked against a decoy. So what the
program does in its own process (a patched bootstrap, asserts compiled away, a
trace hook, an `__eq__` that always says True) cannot touch the verdict. The
verdict is the checker's: its test code ran to the end without an exception.

Costs: one more Python process per program (the checker), and one round trip
through two pipes per call (benchmarks/bench_sandbox.py measures both).
"""

from __future__ import annotations

import itertools
import json
import os
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from eval.sandbox.bootstrap import BOOTSTRAP_HEAD, BOOTSTRAP_SERVE_RUN
from eval.sandbox.cgroup import join as join_cgroup
from eval.sandbox.limits import ExecutionResult, SandboxLimits, SandboxUnavailable
from eval.sandbox.process import LIBC, PR_SET_PDEATHSIG, close_all, printable
from eval.sandbox.program import run_contained, sandbox_host

CODEC = (Path(__file__).with_name("codec.py")).read_text()
MAX_ANSWER_BYTES = 8 << 20  # one call's answer, as JSON
VERDICT_BYTES = 4096

# The program's side: after its code ran, answer each call on the request pipe: a call of one
# of its functions, or an operation on an object it returned (kept here, sent as a handle).
SERVE = CODEC + """
requests, answers = os.fdopen(extra[0], 'rb'), extra[1]
namespace = main.__dict__
_HANDLES = []

class _Stranger:
    pass

def honest(target, operation, answer):
    # An object that says it equals a stranger (an __eq__ that always says True) would pass any test.
    try:
        says = bool(target == _Stranger()) if operation == 'eq' else not bool(target != _Stranger())
    except Exception:
        says = False
    if says:
        raise NotPlainData(f'an object of {type(target).__qualname__[:100]} that equals anything')
    return answer

import operator
OPERATIONS = {'eq': lambda o, x: bool(o == x), 'ne': lambda o, x: bool(o != x), 'hash': hash, 'repr': repr, 'str': str,
              'bool': bool, 'len': len, 'getattr': getattr, 'setattr': setattr, 'getitem': lambda o, k: o[k],
              'list': list, 'contains': lambda o, x: x in o, 'float': float, 'int': int, 'index': operator.index,
              'abs': abs, 'neg': operator.neg, 'pos': operator.pos, 'round': round}
for _name in ('lt', 'le', 'gt', 'ge', 'add', 'sub', 'mul', 'truediv', 'floordiv', 'mod', 'pow'):
    OPERATIONS[_name] = getattr(operator, _name)
    OPERATIONS['r' + _name] = lambda o, x, _operation=getattr(operator, _name): _operation(x, o)

def serve(call):
    if 'op' in call:
        target, operation = from_wire({'$': 'handle', 'v': [call['handle'], '']}), call['op']
        answer = OPERATIONS[operation](target, *from_wire(call['args']))
        return honest(target, operation, answer) if operation in ('eq', 'ne') else answer
    name = call['call']
    if name not in namespace:
        raise NameError(f'name {name!r} is not defined')
    return namespace[name](*from_wire(call['args']), **from_wire(call['kwargs']))

for line in requests:
    try:
        answer = {'return': to_wire(plain(serve(json.loads(line))))}
    except NotPlainData as error:
        answer = {'unplain': str(error)}
    except BaseException as error:
        try:
            answer = {'raise': [type(error).__name__, str(error)[:2000]]}
        except BaseException:
            answer = {'raise': ['Exception', '']}
    data = memoryview(dumps(answer).encode())
    try:
        while data:
            data = data[os.write(answers, data):]
    except BrokenPipeError:  # the tests ended (their verdict is in): nothing is left to answer
        break
"""
SERVE_BOOTSTRAP = BOOTSTRAP_HEAD + BOOTSTRAP_SERVE_RUN + SERVE

# The trusted side: `python -I -S -c CHECKER <request fd> <answer fd> <verdict fd>
# <answer cap>`, the job (TrustedTests as JSON) on stdin.
CHECKER = "import builtins, json, os, sys\n" + CODEC + """
class ProgramEnded(Exception):
    pass

requests, answers = os.fdopen(int(sys.argv[1]), 'wb', buffering=0), os.fdopen(int(sys.argv[2]), 'rb')
verdict_fd, limit = int(sys.argv[3]), int(sys.argv[4])

def call(name, args, kwargs):
    return ask({'call': name, 'args': to_wire(list(args)), 'kwargs': to_wire(dict(kwargs))}, name + '()')

def ask(message, name):
    try:
        requests.write(dumps(message).encode())
        line = answers.readline(limit + 1)
    except BrokenPipeError:
        line = b''
    if not line:
        raise ProgramEnded(f'the program ended before {name} returned')
    if len(line) > limit:
        raise NotPlainData(f'the answer of {name} is over {limit} bytes')
    try:
        answer = json.loads(line)
    except ValueError as error:
        raise NotPlainData(f'the answer of {name} is not JSON: {error}') from None
    if type(answer) is not dict or len(answer) != 1:
        raise NotPlainData(f'the answer of {name} is malformed')
    if 'return' in answer:
        return from_wire(answer['return'])
    if 'unplain' in answer:
        raise NotPlainData(f'{name} returned what is not plain data: {str(answer["unplain"])[:200]}')
    kind, message = answer.get('raise', ('', ''))
    error = getattr(builtins, kind, None) if type(kind) is str else None
    if isinstance(error, type) and issubclass(error, Exception) and error.__module__ == 'builtins' and \
            not issubclass(error, (StopIteration, StopAsyncIteration)):  # those would end a trusted loop silently
        raise error(str(message))
    raise RuntimeError(f'{name} raised {str(kind)[:100]}: {str(message)[:1000]}')

def proxy(name):
    def candidate(*args, **kwargs):
        return call(name, args, kwargs)
    candidate.__name__ = candidate.__qualname__ = name
    return candidate

# A handle compared with a plain value: the program's own operator decides, as officially, but it
# sees the value, so it is also asked about a decoy of the same type that differs (or, for an
# ordering, lies beyond every value), in random order: an object that says yes to both says yes to
# anything, and fails (an __eq__ that always says True, or True for every builtin value).
import math, random
_RANDOM = random.SystemRandom()

def _decoy(operation, value):
    nonce = _RANDOM.randrange(1, 1 << 30)
    kind = type(value)
    if operation in ('lt', 'le', 'gt', 'ge'):
        low = operation in ('lt', 'le')
        if kind in (int, float):
            return -math.inf if low else math.inf
        return ('' if low else chr(0x10FFFF) * 64) if kind is str else None
    if kind is bool:
        return not value
    if kind is int or (kind is float and math.isfinite(value)):
        return value + nonce * (1 + abs(value))
    if kind is str or kind is bytes:
        return value + (chr(33 + nonce % 94) * 2 if kind is str else bytes([nonce % 256]) * 2)
    if kind is list or kind is tuple:
        return value + kind([nonce])
    if kind is set or kind is frozenset:
        return value | {nonce}
    if kind is dict:
        return {**value, ('decoy', nonce): nonce}
    return nonce

class Remote:
    # An object of the program's, kept in its process: every operation is asked of the program; a
    # comparison with a plain value is checked against a decoy (_compare).
    __slots__ = ('_index', '_kind')

    def __init__(self, index, kind):
        object.__setattr__(self, '_index', index)
        object.__setattr__(self, '_kind', kind)

    def _ask(self, operation, *args, result=None):
        answer = ask({'op': operation, 'handle': self._index, 'args': to_wire(list(args))}, f'{self._kind}.{operation}')
        if result is not None and type(answer) is not result:
            raise NotPlainData(f'{self._kind}.{operation} gave a {type(answer).__name__}, not a {result.__name__}')
        return answer

    def _compare(self, operation, other):
        decoy = _decoy(operation, other) if type(other) is not Remote else None
        # Two of the program's objects, or an ordering with no decoy: its own operator, checked only by the
        # call server's stranger probe (`honest`), which runs in the program's process: a documented limit.
        if decoy is None:
            return self._ask(operation, other, result=bool)
        asked = [other, decoy] if _RANDOM.random() < 0.5 else [decoy, other]
        answers = {id(value): self._ask(operation, value, result=bool) for value in asked}
        says_yes_to_decoy = answers[id(decoy)] if operation != 'ne' else not answers[id(decoy)]
        if says_yes_to_decoy and (answers[id(other)] if operation != 'ne' else not answers[id(other)]):
            raise NotPlainData(f'an object of {self._kind} that compares {operation} with anything')
        return answers[id(other)]

    def __getattr__(self, name):
        if name.startswith('__') or name in ('_index', '_kind'):  # protocols (copy, pickle) and our own slots
            raise AttributeError(name)
        return self._ask('getattr', name)

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    __eq__ = lambda self, other: self._compare('eq', other)
    __ne__ = lambda self, other: self._compare('ne', other)
    __hash__ = lambda self: self._ask('hash', result=int)
    __repr__ = lambda self: self._ask('repr', result=str)
    __str__ = lambda self: self._ask('str', result=str)
    __bool__ = lambda self: self._ask('bool', result=bool)
    __len__ = lambda self: self._ask('len', result=int)
    __setattr__ = lambda self, name, value: self._ask('setattr', name, value) and None
    __getitem__ = lambda self, key: self._ask('getitem', key)
    __iter__ = lambda self: iter(self._ask('list', result=list))
    __contains__ = lambda self, item: self._ask('contains', item, result=bool)
    __float__ = lambda self: self._ask('float', result=float)
    __int__ = lambda self: self._ask('int', result=int)
    __index__ = lambda self: self._ask('index', result=int)
    __abs__ = lambda self: self._ask('abs')
    __neg__ = lambda self: self._ask('neg')
    __pos__ = lambda self: self._ask('pos')
    __round__ = lambda self, *digits: self._ask('round', *digits)

# Orderings as comparisons (_compare); arithmetic with a handle on either side: the program's own operators.
for _name in ('lt', 'le', 'gt', 'ge'):
    setattr(Remote, f'__{_name}__', lambda self, other, _name=_name: self._compare(_name, other))
for _name in ('add', 'sub', 'mul', 'truediv', 'floordiv', 'mod', 'pow'):
    setattr(Remote, f'__{_name}__', lambda self, other, _name=_name: self._ask(_name, other))
    setattr(Remote, f'__r{_name}__', lambda self, other, _name=_name: self._ask('r' + _name, other))

_REMOTE = Remote

job = json.load(sys.stdin)
namespace = {'__name__': '__main__', '__builtins__': builtins}
stage = 'prelude'
try:
    exec(compile(job['prelude'], '<tests: prelude>', 'exec', dont_inherit=True, optimize=0), namespace)
    namespace.update({name: proxy(name) for name in job['proxies']})
    stage = 'tests'
    exec(compile(job['body'], '<tests>', 'exec', dont_inherit=True, optimize=0), namespace)
    verdict = {'passed': True}
except BaseException as error:
    verdict = {'passed': False, 'stage': stage, 'error': f'{type(error).__name__}: {error}'[:2000]}
# One write of at most 4,096 bytes (PIPE_BUF: whole, into any pipe, never blocking); JSON's
# escapes make a character up to 12 bytes, so the message is shortened, by characters, until it fits.
data = json.dumps(verdict).encode()
while len(data) > 4096 and verdict.get('error'):
    verdict['error'] = verdict['error'][:len(verdict['error']) // 2]
    data = json.dumps(verdict).encode()
os.write(verdict_fd, data)
"""


@dataclass(frozen=True)
class TrustedTests:
    """What the trusted side runs: `prelude` (trusted code: imports, helpers, the
    test functions), then `body` with each name in `proxies` bound to a proxy of
    the program's function of that name. It passes when `body` raises nothing."""

    prelude: str
    body: str
    proxies: tuple[str, ...] = field(default_factory=tuple)


def run_calls(program: str, job: TrustedTests, limits: SandboxLimits = SandboxLimits()) -> ExecutionResult:
    """Run `program` in the sandbox as the server of its functions and `job`'s
    tests in a trusted process; passed iff the tests ran through in time.

    Args:
        program (str): the program's source; the functions the tests call are defined at its top level.
        job (TrustedTests): the tests, run in the trusted process.
        limits (SandboxLimits): what the program may use; they also cap the checker's CPU time and memory.
    """
    request_r, request_w = os.pipe()
    answer_r, answer_w = os.pipe()
    verdict_r, verdict_w = os.pipe()
    caps = None
    try:
        caps = _CheckerLimits(limits, os.getpid())
        checker = _start_checker(job, caps, request_w, answer_r, verdict_w)
    except BaseException:
        close_all((request_r, request_w, answer_r, answer_w, verdict_r, verdict_w))
        if caps is not None:
            caps.release()
        raise
    close_all((request_w, answer_r, verdict_w))
    try:
        result, _ = run_contained(program, limits, SERVE_BOOTSTRAP, extra_fds=(request_r, answer_w),
                         during=lambda deadline: _wait(checker, deadline))
        verdict = _verdict(checker, verdict_r, caps)
    finally:
        if checker.poll() is None:
            checker.kill()
            checker.wait()
        os.close(verdict_r)
        caps.release()
    return _judged(result, verdict)


def _start_checker(job: TrustedTests, caps: _CheckerLimits, request_w: int, answer_r: int,
                   verdict_w: int) -> subprocess.Popen:
    job_fd = os.memfd_create("job")
    try:
        os.write(job_fd, json.dumps({"prelude": job.prelude, "body": job.body, "proxies": list(job.proxies)}).encode())
        os.lseek(job_fd, 0, os.SEEK_SET)
        # -S: the standard library only (all HumanEval's and MBPP's tests need), and a
        # start without the site packages' path hooks, several times faster here.
        args = [sys.executable, "-I", "-S", "-c", CHECKER, str(request_w), str(answer_r), str(verdict_w), str(MAX_ANSWER_BYTES)]
        try:
            return subprocess.Popen(args, stdin=job_fd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    pass_fds=(request_w, answer_r, verdict_w), env=CHECKER_ENV,
                                    cwd="/", start_new_session=True, preexec_fn=caps)
        except (OSError, subprocess.SubprocessError) as error:
            raise SandboxUnavailable(f"could not start the trusted test process: {error}") from error
    finally:
        os.close(job_fd)


# The trusted checker's own limits (never more than the program's): far above what HumanEval's
# and MBPP's tests on their canonical solutions, and honest answers near MAX_ANSWER_BYTES, take
# in the checker.
CHECKER_CPU_SECONDS = 2
# One thread for numpy, if a numpy value makes the checker import it: a thread pool per core would
# take address space from the checker's limit on a many-core machine.
CHECKER_ENV = {"PATH": "/usr/bin:/bin", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
CHECKER_MEMORY_BYTES = 256 << 20
CHECKER_PROCESSES = 4  # the checker forks nothing; a few for a test that would
_CHECKER_NUMBERS = itertools.count()  # names its cgroup: unique among this evaluator's checkers


class _CheckerLimits:
    """The trusted side runs only benchmark code on decoded values, but how much it
    decodes and what its tests do with it is the program's choice (a set of ints
    of one hash is quadratic to build, a huge range expanded fills memory). It is
    outside the program's cgroup, so it gets limits of its own, far below the
    program's: a cgroup where one can be made (memory and processes of all it
    runs), and always rlimits on CPU time and address space (so that an answer
    too big to decode is a MemoryError in its verdict, not a kill). It must not
    outlive the evaluator either. The object is also the preexec_fn that applies
    them between fork and exec (raw system calls only)."""

    def __init__(self, limits: SandboxLimits, parent: int) -> None:
        self.parent = parent
        self.cpu_seconds = min(limits.cpu_seconds, CHECKER_CPU_SECONDS)
        self.memory_bytes = min(limits.memory_bytes, CHECKER_MEMORY_BYTES)
        cgroups = sandbox_host().cgroups
        self.cgroup = None if cgroups is None else cgroups.create(
            f"checker-{next(_CHECKER_NUMBERS)}", self.memory_bytes, CHECKER_PROCESSES)
        self.cgroup_procs = self.cgroup.procs_files() if self.cgroup is not None else []

    def __call__(self) -> None:
        join_cgroup(self.cgroup_procs)
        resource.setrlimit(resource.RLIMIT_CPU, (self.cpu_seconds, self.cpu_seconds + 1))
        resource.setrlimit(resource.RLIMIT_AS, (self.memory_bytes, self.memory_bytes))
        LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != self.parent:
            os._exit(1)

    def ended(self, returncode: int) -> str:
        """Why the checker ended without a verdict, in words."""
        if returncode == -signal.SIGXCPU:
            return f"the test process went over its CPU limit ({self.cpu_seconds} s) on the program's answers"
        if returncode == -signal.SIGKILL:
            return (f"the test process was killed (over its memory limit of {self.memory_bytes >> 20} MiB or "
                    f"its CPU limit of {self.cpu_seconds} s, or still running after the program ended)")
        return f"the test process ended ({returncode})"

    def release(self) -> None:
        """Remove the cgroup (killing what still runs in it)."""
        if self.cgroup is not None:
            self.cgroup.destroy()
            self.cgroup = None


def _wait(checker: subprocess.Popen, deadline: float) -> bool:
    try:
        checker.wait(timeout=max(0.0, deadline - time.monotonic()))
        return True
    except subprocess.TimeoutExpired:
        return False


def _verdict(checker: subprocess.Popen, verdict_r: int, caps: _CheckerLimits) -> dict:
    """The checker's verdict; once the sandbox is gone the checker ends at once."""
    try:
        checker.wait(timeout=5)
    except subprocess.TimeoutExpired:
        checker.kill()
        checker.wait()
    os.set_blocking(verdict_r, False)
    try:
        data = os.read(verdict_r, VERDICT_BYTES)
        return json.loads(data) if data else {"passed": False, "error": caps.ended(checker.returncode)}
    except (BlockingIOError, ValueError):
        return {"passed": False, "error": "the test process left no verdict"}


def _judged(result: ExecutionResult, verdict: dict) -> ExecutionResult:
    result.passed = verdict.get("passed") is True and result.status != "timeout"
    if result.containment != "not run":
        result.containment += ", tests in a trusted process"
    if result.passed:
        result.status = "passed"
    elif verdict.get("error"):  # it may quote the program's text: escaped as its output is
        error = verdict["error"]
        last_words = [line for line in result.stderr.splitlines() if line.strip()][-1:]
        if error.startswith("ProgramEnded") and last_words:  # why it ended: a syntax error, an uncaught exception
            error += f" (the program's stderr ends: {last_words[0].strip()[:300]})"
        result.stderr += printable(f"\ntests ({verdict.get('stage', 'tests')}): {error}\n")
    return result
