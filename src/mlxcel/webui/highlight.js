// A tiny code highlighter: comments, strings, numbers and keywords for the common families.
import { escapeHtml } from "./util.js";

const C_LIKE =
  "auto break case catch char class const continue default delete do double else enum " +
  "extends extern false final finally float for func go if impl import in int interface " +
  "let long loop match mod mut namespace new nil null nullptr package private protected " +
  "pub public return self Self short static struct super switch template this throw " +
  "trait true try type typedef typename union unsigned use using var void volatile where " +
  "while fn defer chan range bool string";

const FAMILIES = {
  js: {
    comment: String.raw`\/\/[^\n]*|\/\*[\s\S]*?\*\/`,
    keywords:
      "async await break case catch class const continue default delete do else export " +
      "extends false finally for from function if import in instanceof let new null of " +
      "return static super switch this throw true try typeof undefined var void while yield " +
      "interface type enum implements readonly",
  },
  py: {
    comment: String.raw`#[^\n]*`,
    keywords:
      "and as assert async await break class continue def del elif else except False " +
      "finally for from global if import in is lambda None nonlocal not or pass raise " +
      "return True try while with yield self match case",
  },
  c: { comment: String.raw`\/\/[^\n]*|\/\*[\s\S]*?\*\/`, keywords: C_LIKE },
  sh: {
    comment: String.raw`#[^\n]*`,
    keywords:
      "if then else elif fi for in do done while until case esac function return export " +
      "local echo exit cd set unset source",
  },
  sql: {
    comment: String.raw`--[^\n]*`,
    keywords:
      "select from where and or not insert into values update set delete create table " +
      "drop alter join left right inner outer on group by order having limit as null is " +
      "distinct union all primary key index with case when then else end",
    caseless: true,
  },
};

const ALIASES = {
  js: "js", javascript: "js", ts: "js", typescript: "js", jsx: "js", tsx: "js", json: "js",
  py: "py", python: "py", python3: "py", toml: "py", yaml: "py", yml: "py",
  c: "c", h: "c", cpp: "c", "c++": "c", cc: "c", java: "c", rust: "c", rs: "c", go: "c",
  cs: "c", csharp: "c", kotlin: "c", swift: "c", zig: "c",
  sh: "sh", bash: "sh", shell: "sh", zsh: "sh", console: "sh",
  sql: "sql",
};

const STRING = String.raw`"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'|` + "`(?:\\\\.|[^`\\\\])*`";
const NUMBER = String.raw`\b0x[0-9a-fA-F]+\b|\b\d[\d_]*(?:\.\d+)?(?:[eE][+-]?\d+)?\b`;
const WORD = String.raw`[A-Za-z_$][\w$]*`;
const compiled = new Map();

function family(lang) {
  const name = ALIASES[(lang || "").toLowerCase()];
  if (!name) return null;
  if (!compiled.has(name)) {
    const spec = FAMILIES[name];
    compiled.set(name, {
      pattern: new RegExp(`(${spec.comment})|(${STRING})|(${NUMBER})|(${WORD})`, "g"),
      keywords: new Set(spec.keywords.split(" ")),
      caseless: Boolean(spec.caseless),
    });
  }
  return compiled.get(name);
}

const span = (kind, text) => `<span class="tok-${kind}">${escapeHtml(text)}</span>`;

/** Code as escaped HTML with <span class="tok-*"> around what it recognises. */
export function highlight(code, lang) {
  const spec = family(lang);
  if (!spec) return escapeHtml(code);
  let out = "";
  let last = 0;
  for (const match of code.matchAll(spec.pattern)) {
    const [text, comment, string, number, word] = match;
    out += escapeHtml(code.slice(last, match.index));
    if (comment) out += span("c", text);
    else if (string) out += span("s", text);
    else if (number) out += span("n", text);
    else if (word && spec.keywords.has(spec.caseless ? word.toLowerCase() : word)) {
      out += span("k", word);
    } else out += escapeHtml(text);
    last = match.index + text.length;
  }
  return out + escapeHtml(code.slice(last));
}
