/*
 * _expscan: the steady-state scrape of a text exposition (0.0.4) body, in C.
 *
 * scan(text, entries, sample_limit, comment) walks the lines of `text` exactly as
 * collector/sources/expfmt.py: scan() does when every sample line is `prefix value` with a prefix
 * already in `entries` (the target's series cache, filled by earlier scrapes): it returns the
 * list of (entries[prefix], float(value), line number, prefix) of the lines whose entry is not
 * None, and calls comment(line, line_number) for every line starting with '#' (the Python
 * parser's TYPE/HELP handling, which may raise). For anything else (a prefix not in the cache,
 * a value float() refuses or with '_', a duplicate series, more than sample_limit samples) it
 * returns None without having decided anything, and the caller runs the pure-Python scanner,
 * which parses the new series or raises the error naming its line. So this file never decides
 * that a body is good or bad; it only does the common case without the interpreter's per-line
 * overhead.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *scan(PyObject *self, PyObject *args) {
    PyObject *text, *entries, *comment;
    Py_ssize_t sample_limit;
    if (!PyArg_ParseTuple(args, "UO!nO", &text, &PyDict_Type, &entries, &sample_limit, &comment))
        return NULL;
    Py_ssize_t length = PyUnicode_GET_LENGTH(text);
    PyObject *out = PyList_New(0);
    PyObject *seen = PyDict_New();
    if (out == NULL || seen == NULL)
        goto error;
    Py_ssize_t start = 0, lineno = 0;
    while (start < length) {
        Py_ssize_t end = PyUnicode_FindChar(text, '\n', start, length, 1);
        if (end == -2)
            goto error;
        if (end == -1)
            end = length;
        lineno++;
        if (end > start) {
            if (PyUnicode_READ_CHAR(text, start) == '#') {
                PyObject *line = PyUnicode_Substring(text, start, end);
                if (line == NULL)
                    goto error;
                PyObject *r = PyObject_CallFunction(comment, "On", line, lineno);
                Py_DECREF(line);
                if (r == NULL)
                    goto error; /* the Python parser's own error for this line */
                Py_DECREF(r);
            } else {
                Py_ssize_t cut = PyUnicode_FindChar(text, ' ', start, end, -1);
                if (cut == -2)
                    goto error;
                if (cut < 0)
                    goto fallback;
                PyObject *key = PyUnicode_Substring(text, start, cut);
                if (key == NULL)
                    goto error;
                PyObject *hit = PyDict_GetItemWithError(entries, key); /* borrowed */
                if (hit == NULL) {
                    Py_DECREF(key);
                    if (PyErr_Occurred())
                        goto error;
                    goto fallback; /* a series this target has not shown before */
                }
                Py_INCREF(hit);
                Py_ssize_t underscore = PyUnicode_FindChar(text, '_', cut + 1, end, 1);
                PyObject *raw = underscore == -1 ? PyUnicode_Substring(text, cut + 1, end) : NULL;
                PyObject *value = raw != NULL ? PyFloat_FromString(raw) : NULL;
                Py_XDECREF(raw);
                int duplicate = value != NULL ? PyDict_Contains(seen, key) : 0;
                PyObject *number = value != NULL && duplicate == 0 ? PyLong_FromSsize_t(lineno) : NULL;
                if (number == NULL || PyDict_SetItem(seen, key, number) < 0 ||
                    (sample_limit > 0 && PyDict_GET_SIZE(seen) > sample_limit)) {
                    Py_XDECREF(number);
                    Py_XDECREF(value);
                    Py_DECREF(hit);
                    Py_DECREF(key);
                    if (underscore == -2 || duplicate < 0)
                        goto error;
                    PyErr_Clear(); /* float() refused the value, or a duplicate, or over the limit */
                    goto fallback;
                }
                if (hit != Py_None) {
                    PyObject *item = PyTuple_Pack(4, hit, value, number, key);
                    if (item == NULL || PyList_Append(out, item) < 0) {
                        Py_XDECREF(item);
                        Py_DECREF(number);
                        Py_DECREF(value);
                        Py_DECREF(hit);
                        Py_DECREF(key);
                        goto error;
                    }
                    Py_DECREF(item);
                }
                Py_DECREF(number);
                Py_DECREF(value);
                Py_DECREF(hit);
                Py_DECREF(key);
            }
        }
        start = end + 1;
    }
    Py_DECREF(seen);
    return out;
fallback:
    Py_DECREF(seen);
    Py_DECREF(out);
    Py_RETURN_NONE;
error:
    Py_XDECREF(seen);
    Py_XDECREF(out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "The steady-state scan of a text exposition body (see the file's comment)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_expscan", NULL, -1, methods};

PyMODINIT_FUNC PyInit__expscan(void) { return PyModule_Create(&module); }
