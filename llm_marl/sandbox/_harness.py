"""The test harness that :func:`llm_marl.sandbox.run_tests` runs inside the sandbox.

It is not imported: ``run_tests`` takes this file's text, appends a call
``main(mark, program, tests, budget)`` and runs the result as the sandboxed program (so it
needs no access to this file). ``main`` runs ``program``, then each test statement in the
program's globals, each under a ``budget``-second SIGALRM, and writes one verdict line
(``mark`` + JSON) per step to the original stdout: ``{"load": failure}``, then
``{"test": index, "failure": failure}``, where ``failure`` is None or ``{"error_type",
"message", "lineno", "offset"}``. It must run on any interpreter ``run_program`` accepts
(``python=``), so it keeps to plain syntax.
"""

import json, os, signal, sys, traceback


class Timeout(BaseException):
    pass


def alarm(signum, frame):
    raise Timeout


def emit(report, mark, record):
    try:
        sys.stdout.flush()
    except BaseException:
        pass
    os.write(report, ("\n" + mark + json.dumps(record) + "\n").encode())


def text(value):
    try:
        return str(value)[:500]
    except BaseException:
        return "<unprintable>"


def failure(exc, filename, budget):
    if isinstance(exc, Timeout):
        return {"error_type": "Timeout", "message": "exceeded %gs" % budget}
    if isinstance(exc, SyntaxError) and exc.filename == filename:
        return {"error_type": type(exc).__name__, "message": text(exc.msg),
                "lineno": exc.lineno, "offset": exc.offset}
    lines = [frame.lineno for frame in traceback.extract_tb(exc.__traceback__)
             if frame.filename == filename]
    return {"error_type": type(exc).__name__, "message": text(exc),
            "lineno": lines[-1] if lines else None, "offset": None}


def run(source, filename, namespace, budget):
    try:
        code = compile(source, filename, "exec")
        signal.setitimer(signal.ITIMER_REAL, budget)
        try:
            exec(code, namespace)
        finally:  # an alarm that fires in here is still caught below
            signal.setitimer(signal.ITIMER_REAL, 0)
    except BaseException as exc:
        return failure(exc, filename, budget)
    return None


def main(mark, program, tests, budget):
    report = os.dup(1)  # survives the program replacing or closing sys.stdout
    signal.signal(signal.SIGALRM, alarm)
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    error = run(program, "<program>", namespace, budget)
    emit(report, mark, {"load": error})
    if error is None:
        for index, test in enumerate(tests):
            error = run(test, "<test %d>" % index, namespace, budget)
            emit(report, mark, {"test": index, "failure": error})
