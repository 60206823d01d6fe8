/*
 * _expscan: the steady-state scrape of a text exposition (0.0.4) body, in C.
 *
 * scan(text, entries, sample_limit, comment, comments, types, layout) walks the lines of `text`
 * exactly as collector/sources/expfmt.py: scan() does when every sample line is `prefix value` with a
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
 *
 * `layout` (a list, the target's, kept between scrapes) is what the last scan that returned a list
 * saw, line by line: (prefix, entry) of a sample line, (line, what `comments` holds for it) of a
 * comment line. A body whose lines follow it exactly (the same comment lines and sample prefixes
 * in the same order, each prefix followed by one space and the value: what a server sends scrape
 * after scrape) is read against it, without building, hashing and looking up each prefix and
 * without the duplicate check (the layout has none: it passed it). Any difference and the body is
 * scanned as above, from its first line, and `layout` becomes what that scan saw (or empty when it
 * returns None).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Apply what the memo holds for an accepted comment line (None, or a TYPE line's (family, type)):
 * 1 when done (nothing to add, or the type set in `types`), 0 when the Python parser must see the
 * line (a second TYPE for a family, which it names), -1 on a Python error. */
static int declare(PyObject *what, PyObject *types) {
    if (what == Py_None)
        return 1;
    if (!PyTuple_Check(what) || PyTuple_GET_SIZE(what) != 2)
        return 0;
    PyObject *family = PyTuple_GET_ITEM(what, 0), *kind = PyTuple_GET_ITEM(what, 1);
    int twice = PyDict_Contains(types, family);
    if (twice != 0)
        return twice < 0 ? -1 : 0;
    return PyDict_SetItem(types, family, kind) < 0 ? -1 : 1;
}

/* A comment line the Python parser accepted before (`declare`); 0 as well for a new line. */
static int remembered(PyObject *line, PyObject *comments, PyObject *types) {
    PyObject *what = PyDict_GetItemWithError(comments, line); /* borrowed */
    if (what == NULL)
        return PyErr_Occurred() ? -1 : 0;
    return declare(what, types);
}

/* Read `text` against `layout` into `out` (see the file's comment): 1 when it follows the layout,
 * 0 when it does not (what was put in `out` and `types` is then to be dropped), -1 on an error. */
static int follow(PyObject *text, PyObject *layout, Py_ssize_t sample_limit, PyObject *types, PyObject *out) {
    Py_ssize_t length = PyUnicode_GET_LENGTH(text), n = PyList_GET_SIZE(layout);
    Py_ssize_t start = 0, lineno = 0, i = 0, samples = 0;
    if (n == 0)
        return 0;
    while (start < length) {
        Py_ssize_t end = PyUnicode_FindChar(text, '\n', start, length, 1);
        if (end == -2)
            return -1;
        if (end == -1)
            end = length;
        lineno++;
        if (end > start) {
            if (i >= n)
                return 0;
            PyObject *entry = PyList_GET_ITEM(layout, i++); /* (str, what), as `record` made it */
            if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 2 || !PyUnicode_Check(PyTuple_GET_ITEM(entry, 0)))
                return 0;
            PyObject *expected = PyTuple_GET_ITEM(entry, 0), *what = PyTuple_GET_ITEM(entry, 1);
            Py_ssize_t len = PyUnicode_GET_LENGTH(expected);
            if (PyUnicode_READ_CHAR(text, start) == '#') {
                if (end - start != len)
                    return 0;
                Py_ssize_t same = PyUnicode_Tailmatch(text, expected, start, end, -1);
                if (same != 1)
                    return same < 0 ? -1 : 0;
                int declared = declare(what, types);
                if (declared != 1)
                    return declared;
                start = end + 1;
                continue;
            }
            if (end - start <= len + 1 || PyUnicode_READ_CHAR(text, start + len) != ' ')
                return 0;
            Py_ssize_t same = PyUnicode_Tailmatch(text, expected, start, start + len, -1);
            if (same != 1)
                return same < 0 ? -1 : 0;
            /* the prefix's space must be the line's last (as the scan's cut), the value without '_' */
            Py_ssize_t space = PyUnicode_FindChar(text, ' ', start + len + 1, end, 1);
            Py_ssize_t underscore = space == -1 ? PyUnicode_FindChar(text, '_', start + len + 1, end, 1) : -1;
            if (space == -2 || underscore == -2)
                return -1;
            if (space != -1 || underscore != -1)
                return 0;
            PyObject *raw = PyUnicode_Substring(text, start + len + 1, end);
            if (raw == NULL)
                return -1;
            PyObject *value = PyFloat_FromString(raw);
            Py_DECREF(raw);
            if (value == NULL) {
                if (!PyErr_ExceptionMatches(PyExc_ValueError))
                    return -1;
                PyErr_Clear(); /* float() refused it: the scan hands the body to the Python parser */
                return 0;
            }
            samples++;
            if (what != Py_None) {
                PyObject *number = PyLong_FromSsize_t(lineno);
                PyObject *item = number != NULL ? PyTuple_Pack(4, what, value, number, expected) : NULL;
                Py_XDECREF(number);
                Py_DECREF(value);
                if (item == NULL)
                    return -1;
                int appended = PyList_Append(out, item);
                Py_DECREF(item);
                if (appended < 0)
                    return -1;
            } else {
                Py_DECREF(value);
            }
        }
        start = end + 1;
    }
    if (i != n || (sample_limit > 0 && samples > sample_limit))
        return 0;
    return 1;
}

/* Append (str, what) to the layout being recorded (a NULL `fresh` records nothing). */
static int record(PyObject *fresh, PyObject *str, PyObject *what) {
    if (fresh == NULL)
        return 0;
    PyObject *entry = PyTuple_Pack(2, str, what);
    if (entry == NULL)
        return -1;
    int appended = PyList_Append(fresh, entry);
    Py_DECREF(entry);
    return appended;
}

static PyObject *scan(PyObject *self, PyObject *args) {
    PyObject *text, *entries, *comment, *comments, *types, *layout;
    Py_ssize_t sample_limit;
    if (!PyArg_ParseTuple(args, "UO!nOO!O!O!", &text, &PyDict_Type, &entries, &sample_limit, &comment, &PyDict_Type,
                          &comments, &PyDict_Type, &types, &PyList_Type, &layout))
        return NULL;
    Py_ssize_t length = PyUnicode_GET_LENGTH(text);
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    int followed = follow(text, layout, sample_limit, types, out);
    if (followed != 0) {
        if (followed == 1)
            return out;
        Py_DECREF(out);
        return NULL;
    }
    /* not the layout: drop what was read against it, and scan the body from its first line */
    PyDict_Clear(types);
    if (PyList_SetSlice(out, 0, PyList_GET_SIZE(out), NULL) < 0 ||
        PyList_SetSlice(layout, 0, PyList_GET_SIZE(layout), NULL) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    PyObject *fresh = PyList_New(0); /* the layout this scan sees (NULL: not recorded) */
    PyObject *seen = PyDict_New();
    if (fresh == NULL || seen == NULL)
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
                PyUnicode_InternInPlace(&line); /* one string for the memo, the layout and each scan */
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
                PyObject *what = PyDict_GetItemWithError(comments, line); /* borrowed */
                if (what == NULL && PyErr_Occurred()) {
                    Py_DECREF(line);
                    goto error;
                }
                if (what == NULL) /* not remembered (the memo was just cleared): no layout this time */
                    Py_CLEAR(fresh);
                else if (record(fresh, line, what) < 0) {
                    Py_DECREF(line);
                    goto error;
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
                PyUnicode_InternInPlace(&key); /* the cache's own key (expfmt interns it): one string */
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
                int recorded = record(fresh, key, hit);
                Py_DECREF(number);
                Py_DECREF(value);
                Py_DECREF(hit);
                Py_DECREF(key);
                if (recorded < 0)
                    goto error;
            }
        }
        start = end + 1;
    }
    Py_DECREF(seen);
    if (fresh != NULL) {
        int kept = PyList_SetSlice(layout, 0, 0, fresh);
        Py_DECREF(fresh);
        if (kept < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
fallback:
    Py_DECREF(seen);
    Py_XDECREF(fresh);
    Py_DECREF(out);
    Py_RETURN_NONE;
error:
    Py_XDECREF(seen);
    Py_XDECREF(fresh);
    Py_XDECREF(out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "The steady-state scan of a text exposition body (see the file's comment)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_expscan", NULL, -1, methods};

PyMODINIT_FUNC PyInit__expscan(void) { return PyModule_Create(&module); }
