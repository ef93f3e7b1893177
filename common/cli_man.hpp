// Manual pages from the CLI11 definitions themselves (O7): a program adds
// a hidden `--man` flag with add_man_flag(); the build runs it and installs
// what it prints, so `man tiermemctl` and `tiermemctl --help` come from the
// same option list and cannot drift (tests/integration/man_test.cpp checks
// that they agree). Header-only: CLI11 is, and the programs that use it
// link nothing else in common.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <vector>

namespace tiermem {

struct ManPage {
  std::string name;     // the program
  int section = 1;      // 1: user commands, 8: administration
  std::string summary;  // one line for NAME
  std::string source;   // "tiermem 0.1.0"
  std::vector<std::string> see_also;  // "tiermemd.toml(5)", ...
  std::string extra;    // more roff, after the options (ENVIRONMENT, FILES, ...)
};

namespace man_detail {

// roff-safe text: backslashes doubled, a leading dot or quote escaped.
inline std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '\\') out += "\\e";
    else if (c == '-') out += "\\-";
    else out += c;
  }
  if (!out.empty() && (out[0] == '.' || out[0] == '\'')) out = "\\&" + out;
  return out;
}

inline std::string option_line(const CLI::Option& o) {
  std::string names;
  for (const std::string& s : o.get_snames()) names += (names.empty() ? "" : ", ") + std::string("\\fB\\-") + s + "\\fR";
  for (const std::string& l : o.get_lnames()) names += (names.empty() ? "" : ", ") + std::string("\\fB\\-\\-") + escape(l) + "\\fR";
  if (names.empty()) return "\\fI" + escape(o.get_name()) + "\\fR";  // positional
  if (o.get_type_size() != 0 && !o.get_type_name().empty()) names += " \\fI" + escape(o.get_type_name()) + "\\fR";
  return names;
}

inline void options_of(const CLI::App& app, std::string* out) {
  for (const CLI::Option* o : app.get_options([](const CLI::Option* x) { return !x->get_group().empty(); })) {
    *out += ".TP\n" + option_line(*o) + "\n";
    std::string text = o->get_description();
    if (!o->get_default_str().empty()) text += " (default: " + o->get_default_str() + ")";
    if (o->get_required()) text += " (required)";
    *out += escape(text) + "\n";
  }
}

}  // namespace man_detail

// The page of `app`: NAME, SYNOPSIS, DESCRIPTION, OPTIONS, one section per
// subcommand with its options (COMMANDS), then page.extra and SEE ALSO.
inline std::string man_page(const CLI::App& app, const ManPage& page) {
  using man_detail::escape;
  std::string out = ".TH " + escape(page.name) + " " + std::to_string(page.section) + " \"\" \"" +
                    page.source + "\" \"tiermem\"\n";
  out += ".SH NAME\n" + escape(page.name) + " \\- " + escape(page.summary) + "\n";
  const auto subs = app.get_subcommands([](const CLI::App* s) { return !s->get_group().empty(); });
  out += ".SH SYNOPSIS\n.B " + escape(page.name) + "\n[\\fIOPTIONS\\fR]" + (subs.empty() ? "" : " \\fICOMMAND\\fR [\\fIARGS\\fR]") + "\n";
  out += ".SH DESCRIPTION\n" + escape(app.get_description()) + "\n";
  out += ".SH OPTIONS\n";
  man_detail::options_of(app, &out);
  if (!subs.empty()) {
    out += ".SH COMMANDS\n";
    for (const CLI::App* s : subs) {
      out += ".SS " + escape(s->get_name()) + "\n" + escape(s->get_description()) + "\n";
      man_detail::options_of(*s, &out);
    }
  }
  out += page.extra;
  if (!page.see_also.empty()) {
    out += ".SH SEE ALSO\n";
    for (size_t i = 0; i < page.see_also.size(); ++i) {
      const std::string& ref = page.see_also[i];
      const size_t paren = ref.find('(');
      out += ".BR " + escape(ref.substr(0, paren)) + " " + ref.substr(paren) + (i + 1 < page.see_also.size() ? "," : "") + "\n";
    }
  }
  return out;
}

// A hidden --man flag on `app` that prints its page and exits 0.
inline void add_man_flag(CLI::App& app, ManPage page) {
  app.add_flag_callback(
         "--man",
         [&app, page]() {
           std::fputs(man_page(app, page).c_str(), stdout);
           throw CLI::Success();
         },
         "print the manual page (roff) and exit")
      ->group("");
}

}  // namespace tiermem
