/* Pausing a Python thread from another one (wslm/backend/platforms/cpu/thread_pause.py); built with the C
   kernels by cpu_gemv.py.

   wslm_pause_trace is a CPython trace function (Py_tracefunc) that the asking thread sets on the thread to
   pause alone (_PyEval_SetTrace). At that thread's next Python event it takes itself off, then sleeps with
   the GIL released until `held` has stayed 0 for one period. It is C, not a ctypes callback, so that no
   Python runs inside it: an exception sent to the paused thread (a cancel at exit) is raised once it
   returns, in the thread's own code, where a ctypes callback would print and swallow it.

   The Python symbols are weak: a CPython without _PyEval_SetTrace (3.13 stopped exporting it) still loads
   this library, and wslm_pause_supported() says 0. */
#include <stddef.h>
#include <time.h>

extern int _PyEval_SetTrace(void *tstate, void *func, void *arg) __attribute__((weak));
extern void *PyThreadState_Get(void) __attribute__((weak));
extern void *PyEval_SaveThread(void) __attribute__((weak));
extern void PyEval_RestoreThread(void *tstate) __attribute__((weak));
extern void *PyCapsule_GetPointer(void *capsule, const char *name) __attribute__((weak));

typedef struct {
    volatile int held;     /* a pause was asked since the paused thread last looked */
    volatile int armed;    /* the trace function is set on the thread and has not run yet */
    volatile int paused;   /* the thread is sleeping in it */
    volatile int released; /* no more pauses (the thread ends, or the process exits) */
    long period_us;        /* the pause ends once `held` stays 0 this long */
    volatile long paused_us;
} wslm_pause_state;

int wslm_pause_supported(void) {
    return _PyEval_SetTrace && PyThreadState_Get && PyEval_SaveThread && PyEval_RestoreThread &&
           PyCapsule_GetPointer;
}

int wslm_pause_trace(void *obj, void *frame, int what, void *arg) {
    (void)frame, (void)what, (void)arg;
    wslm_pause_state *s = (wslm_pause_state *)PyCapsule_GetPointer(obj, NULL);
    /* Off at once: while a trace function is set CPython runs the thread's code unspecialized (3.12: every
       thread's). The capsule outlives this: thread_pause.py keeps it. */
    _PyEval_SetTrace(PyThreadState_Get(), NULL, NULL);
    if (s == NULL) return 0;
    s->armed = 0;
    if (s->released) return 0;
    s->paused = 1;
    void *save = PyEval_SaveThread();
    struct timespec period = {s->period_us / 1000000, (s->period_us % 1000000) * 1000};
    while (s->held && !s->released) {
        s->held = 0;
        nanosleep(&period, NULL);
        s->paused_us += s->period_us;
    }
    PyEval_RestoreThread(save);
    s->paused = 0;
    return 0;
}
