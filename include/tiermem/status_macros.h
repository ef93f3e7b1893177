// Early-return helpers for Status and Result (Abseil style), the one way
// tiermem's own code propagates an error it adds nothing to. Opt-in for
// users: not included by any other public header.
//
//   TIERMEM_RETURN_IF_ERROR(client.write(gva, buf, n));
//   TIERMEM_ASSIGN_OR_RETURN(auto info, client.alloc(size));
//
// Where context helps the reader of the error, say it explicitly instead:
//   if (Status s = f(); !s.ok()) return s.with_context("loading " + path);
#pragma once

#include <utility>

#include <tiermem/status.h>

#define TIERMEM_CONCAT_INNER(a, b) a##b
#define TIERMEM_CONCAT(a, b) TIERMEM_CONCAT_INNER(a, b)

// Returns the Status of `expr` from the enclosing function when it is an error.
#define TIERMEM_RETURN_IF_ERROR(expr)                    \
  do {                                                   \
    ::tiermem::Status tiermem_status_ = (expr);          \
    if (!tiermem_status_.ok()) return tiermem_status_;   \
  } while (false)

// `lhs = value of expr`, or returns its error from the enclosing function.
// `lhs` may declare a variable (`auto x`); expands to several statements, so
// it cannot be the body of an unbraced if.
#define TIERMEM_ASSIGN_OR_RETURN(lhs, expr) \
  TIERMEM_ASSIGN_OR_RETURN_IMPL(TIERMEM_CONCAT(tiermem_result_, __LINE__), lhs, expr)
#define TIERMEM_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()
