/* The CPython layout of tracer/runtimes/python.py LAYOUTS, by offsetof() against a version's own
 * internal headers (tests/test_python_layout.py compiles it per interpreter): one JSON line. */
#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include "internal/pycore_runtime.h"
#include "internal/pycore_interp.h"
#include "internal/pycore_frame.h"
#include "internal/pycore_code.h"
#define P(name, expr) printf("\"%s\": %ld, ", name, (long)(expr))
int main(void) {
    printf("{");
    P("runtime_interpreters_head", offsetof(_PyRuntimeState, interpreters.head));
    P("interp_next", offsetof(PyInterpreterState, next));
    P("interp_threads_head", offsetof(PyInterpreterState, threads.head));
    P("tstate_next", offsetof(PyThreadState, next));
    P("tstate_native_thread_id", offsetof(PyThreadState, native_thread_id));
    P("tstate_thread_id", offsetof(PyThreadState, thread_id));
#if PY_VERSION_HEX >= 0x030d0000
    P("tstate_current_frame", offsetof(PyThreadState, current_frame));
    P("cframe_current_frame", -1);
    P("frame_code", offsetof(_PyInterpreterFrame, f_executable));
    P("frame_instr", offsetof(_PyInterpreterFrame, instr_ptr));
#else
    P("tstate_current_frame", offsetof(PyThreadState, cframe));
    P("cframe_current_frame", offsetof(_PyCFrame, current_frame));
    P("frame_code", offsetof(_PyInterpreterFrame, f_code));
    P("frame_instr", offsetof(_PyInterpreterFrame, prev_instr));
#endif
    P("frame_previous", offsetof(_PyInterpreterFrame, previous));
    P("frame_owner", offsetof(_PyInterpreterFrame, owner));
#if PY_VERSION_HEX < 0x030c0000
    P("frame_is_entry", offsetof(_PyInterpreterFrame, is_entry));
    P("owner_cstack", -1);
#else
    P("frame_is_entry", -1);
    P("owner_cstack", FRAME_OWNED_BY_CSTACK);
#endif
    P("code_filename", offsetof(PyCodeObject, co_filename));
    P("code_name", offsetof(PyCodeObject, co_name));
    P("code_qualname", offsetof(PyCodeObject, co_qualname));
    P("code_firstlineno", offsetof(PyCodeObject, co_firstlineno));
    P("code_linetable", offsetof(PyCodeObject, co_linetable));
    P("code_adaptive", offsetof(PyCodeObject, co_code_adaptive));
    P("object_type", offsetof(PyObject, ob_type));
    P("bytes_size", offsetof(PyVarObject, ob_size));
    P("bytes_sval", offsetof(PyBytesObject, ob_sval));
    P("unicode_length", offsetof(PyASCIIObject, length));
    P("unicode_state", offsetof(PyASCIIObject, state));
    P("unicode_ascii_data", sizeof(PyASCIIObject));
    P("unicode_compact_data", sizeof(PyCompactUnicodeObject));
    P("runtime_main_interp", offsetof(_PyRuntimeState, _main_interpreter));
    P("interp_initial_thread", offsetof(PyInterpreterState, _initial_thread));
    printf("\"frame_size\": %ld}\n", (long)sizeof(_PyInterpreterFrame));
    return 0;
}
