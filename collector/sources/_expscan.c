/*
 * _expscan: the steady-state scrape of a text exposition (0.0.4) body, in C.
 *
 * scan(text, entries, sample_limit, comment, comments, types) walks the lines of `text` exactly
 * as collector/sources/expfmt.py: scan() does when every sample line is `prefix value` with a
 * prefix already in `entries` (the target's series cache, filled by earlier scrapes): it returns
 * the list of (entries[prefix], float(value), line number, prefix) of the lines whose entry is
 * not None. A line starting with '#' that is a key of `comments` (the target's comment lines the
 * Python parser accepted in earlier scrapes) is taken from there: None (HELP, UNIT, a plain
 * comment) adds nothing, a (family, type) tuple (TYPE) sets types[family] = type; any other
 * comment line, and a TYPE line whose family `types` already holds, goes to comment(line,
 * line_number) (the Python parser's TYPE/HELP handling, which may raise, and which remembers
 * the lines it accepts in `comments`). For anything else (a prefix not in the cache,
 * a value float() refuses or with '_', a duplicate series, more than sample_limit samples) it
 * returns None without having decided anything, and the caller runs the pure-Python scanner,
 * which parses the new series or raises the error naming its line. So this file never decides
 * that a body is good or bad; it only does the common case without the interpreter's per-line
 * overhead.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* A comment line the Python parser accepted before: 1 when done here (nothing to add, or its TYPE
 * set in `types`), 0 when the Python parser must see it (new, or a second TYPE for a family),
 * -1 on a Python error. */
static int remembered(PyObject *line, PyObject *comments, PyObject *types) {
    PyObject *seen = PyDict_GetItemWithError(comments, line); /* borrowed */
    if (seen == NULL)
        return PyErr_Occurred() ? -1 : 0;
    if (seen == Py_None)
        return 1;
    if (!PyTuple_Check(seen) || PyTuple_GET_SIZE(seen) != 2)
        return 0;
    PyObject *family = PyTuple_GET_ITEM(seen, 0), *kind = PyTuple_GET_ITEM(seen, 1);
    int twice = PyDict_Contains(types, family);
    if (twice != 0)
        return twice < 0 ? -1 : 0; /* the parser names the second TYPE line */
    return PyDict_SetItem(types, family, kind) < 0 ? -1 : 1;
}

static PyObject *scan(PyObject *self, PyObject *args) {
    PyObject *text, *entries, *comment, *comments, *types;
    Py_ssize_t sample_limit;
    if (!PyArg_ParseTuple(args, "UO!nOO!O!", &text, &PyDict_Type, &entries, &sample_limit, &comment, &PyDict_Type,
                          &comments, &PyDict_Type, &types))
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
                int known = remembered(line, comments, types);
                if (known < 0) {
                    Py_DECREF(line);
                    goto error;
                }
                if (!known) {
                    PyObject *r = PyObject_CallFunction(comment, "On", line, lineno);
                    if (r == NULL) {
                        Py_DECREF(line);
                        goto error; /* the Python parser's own error for this line */
                    }
                    Py_DECREF(r);
                }
                Py_DECREF(line);
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
