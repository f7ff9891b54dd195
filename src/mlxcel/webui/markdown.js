// Markdown for model replies. All text is escaped before any tag is added, so HTML in a reply
// shows as text, and links go only to http(s) and mailto addresses.
import { highlight } from "./highlight.js";
import { escapeHtml } from "./util.js";

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^\s`]*)/;
const CLOSING_FENCE = /^ {0,3}(`{3,}|~{3,})\s*$/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$/;
const RULE = /^ {0,3}([-*_])(?:\s*\1){2,}\s*$/;
const QUOTE = /^ {0,3}>\s?/;
const ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
const TABLE_RULE = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;
const SAFE_URL = /^(https?:|mailto:)/i;

/** Markdown source (complete or still streaming) as HTML. */
export function renderMarkdown(source) {
  const text = String(source).replace(/\r\n?/g, "\n").replace(/\u0000/g, "");
  return blocks(text.split("\n"));
}

/** A fenced code block with its language label and a copy button. */
export function codeHtml(code, lang) {
  const label = lang ? escapeHtml(lang) : "code";
  return (
    `<div class="code"><div class="code-head"><span>${label}</span>` +
    `<button type="button" class="copy-code">Copy</button></div>` +
    `<pre><code>${highlight(code, lang)}</code></pre></div>`
  );
}

const leading = (line) => line.match(/^\s*/)[0].length;
const isTable = (lines, i) =>
  lines[i].includes("|") && i + 1 < lines.length && lines[i + 1].includes("-") &&
  TABLE_RULE.test(lines[i + 1]);

function startsBlock(lines, i) {
  const line = lines[i];
  return [FENCE, HEADING, RULE, QUOTE, ITEM].some((re) => re.test(line)) || isTable(lines, i);
}

function blocks(lines) {
  const out = [];
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    const fence = line.match(FENCE);
    const heading = line.match(HEADING);
    if (!line.trim()) i += 1;
    else if (fence) i = codeBlock(lines, i, fence[1], fence[2], out);
    else if (heading) {
      const level = heading[1].length;
      out.push(`<h${level}>${inline(heading[2])}</h${level}>`);
      i += 1;
    } else if (RULE.test(line)) {
      out.push("<hr>");
      i += 1;
    } else if (QUOTE.test(line)) {
      const body = [];
      while (i < lines.length && QUOTE.test(lines[i])) body.push(lines[i++].replace(QUOTE, ""));
      out.push(`<blockquote>${blocks(body)}</blockquote>`);
    } else if (ITEM.test(line)) i = list(lines, i, out);
    else if (isTable(lines, i)) i = table(lines, i, out);
    else i = paragraph(lines, i, out);
  }
  return out.join("");
}

function codeBlock(lines, start, marker, lang, out) {
  const body = [];
  let i = start + 1;
  for (; i < lines.length; i += 1) {
    const closing = lines[i].match(CLOSING_FENCE);
    if (closing && closing[1][0] === marker[0] && closing[1].length >= marker.length) break;
    body.push(lines[i]);
  }
  // A fence still open (the reply is streaming) shows what has come so far.
  out.push(codeHtml(body.join("\n"), lang));
  return i + 1;
}

function list(lines, start, out) {
  const [, space, marker] = lines[start].match(ITEM);
  const indent = space.length;
  const contentIndent = indent + marker.length + 1;
  const ordered = /\d/.test(marker);
  const items = [];
  let loose = false;
  let i = start;
  while (i < lines.length) {
    const line = lines[i];
    const item = line.match(ITEM);
    if (item && item[1].length <= indent + 1) {
      if (/\d/.test(item[2]) !== ordered) break;
      items.push([item[3]]);
    } else if (!line.trim()) {
      const next = lines[i + 1];
      const nextItem = next?.match(ITEM);
      const sibling = nextItem && nextItem[1].length <= indent + 1;
      if (sibling ? /\d/.test(nextItem[2]) !== ordered : !(next && leading(next) > indent)) break;
      loose = true;
      items.at(-1).push("");
    } else if (leading(line) > indent || !startsBlock(lines, i)) {
      items.at(-1).push(line.slice(Math.min(leading(line), contentIndent)));
    } else break;
    i += 1;
  }
  const body = items.map((item) => `<li>${loose ? blocks(item) : tightItem(item)}</li>`).join("");
  const first = Number.parseInt(marker, 10);
  const open = ordered ? (first !== 1 ? `<ol start="${first}">` : "<ol>") : "<ul>";
  out.push(`${open}${body}${ordered ? "</ol>" : "</ul>"}`);
  return i;
}

// A tight item's text is not wrapped in <p>; a nested list or code block follows it.
function tightItem(lines) {
  let k = 1;
  while (k < lines.length && !startsBlock(lines, k)) k += 1;
  const text = inline(lines.slice(0, k).join("\n")).replace(/\n/g, "<br>");
  return text + blocks(lines.slice(k));
}

function cells(line) {
  let text = line.trim();
  if (text.startsWith("|")) text = text.slice(1);
  if (text.endsWith("|") && !text.endsWith("\\|")) text = text.slice(0, -1);
  return text.split(/(?<!\\)\|/).map((cell) => cell.trim().replace(/\\\|/g, "|"));
}

function table(lines, start, out) {
  const head = cells(lines[start]);
  const aligns = cells(lines[start + 1]).map((rule) => {
    if (rule.startsWith(":") && rule.endsWith(":")) return "center";
    if (rule.endsWith(":")) return "right";
    return rule.startsWith(":") ? "left" : "";
  });
  const rows = [];
  let i = start + 2;
  while (i < lines.length && lines[i].includes("|") && lines[i].trim()) rows.push(cells(lines[i++]));
  const cell = (tag, text, k) =>
    `<${tag}${aligns[k] ? ` class="align-${aligns[k]}"` : ""}>${inline(text)}</${tag}>`;
  const headRow = head.map((text, k) => cell("th", text, k)).join("");
  const bodyRows = rows
    .map((row) => `<tr>${head.map((_, k) => cell("td", row[k] ?? "", k)).join("")}</tr>`)
    .join("");
  out.push(
    `<div class="table"><table><thead><tr>${headRow}</tr></thead>` +
      `<tbody>${bodyRows}</tbody></table></div>`,
  );
  return i;
}

function paragraph(lines, start, out) {
  const body = [lines[start]];
  let i = start + 1;
  while (i < lines.length && lines[i].trim() && !startsBlock(lines, i)) body.push(lines[i++]);
  out.push(`<p>${inline(body.join("\n")).replace(/\n/g, "<br>")}</p>`);
  return i;
}

const link = (href, label) =>
  `<a href="${escapeHtml(href)}" target="_blank" rel="noopener noreferrer">${label}</a>`;

/** Inline Markdown: code spans, links, bare URLs, bold, italics and strike-through. */
export function inline(text) {
  const held = [];
  const hold = (html) => `\u0000${held.push(html) - 1}\u0000`;
  let out = text.replace(/(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)/g, (_whole, _ticks, code) =>
    hold(`<code>${escapeHtml(code.replace(/^ ([\s\S]*) $/, "$1"))}</code>`),
  );
  out = out.replace(/\[([^\]\n]+)\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g, (whole, label, url) =>
    SAFE_URL.test(url) ? hold(link(url, emphasis(escapeHtml(label)))) : whole,
  );
  out = out.replace(/\bhttps?:\/\/[^\s<>"'`)\]\u0000]*[^\s<>"'`)\].,;:!?\u0000]/g, (url) =>
    hold(link(url, escapeHtml(url))),
  );
  return emphasis(escapeHtml(out)).replace(/\u0000(\d+)\u0000/g, (_, n) => held[Number(n)]);
}

function emphasis(html) {
  return html
    .replace(/\*\*(?!\s)([\s\S]+?)(?<!\s)\*\*/g, "<strong>$1</strong>")
    .replace(/(^|\W)__(?!\s)([\s\S]+?)(?<!\s)__(?!\w)/g, "$1<strong>$2</strong>")
    .replace(/(^|[^\w*])\*(?![\s*])([^*\n]+?)(?<!\s)\*(?![\w*])/g, "$1<em>$2</em>")
    .replace(/(^|\W)_(?![\s_])([^_\n]+?)(?<!\s)_(?!\w)/g, "$1<em>$2</em>")
    .replace(/~~(?!\s)([\s\S]+?)(?<!\s)~~/g, "<del>$1</del>");
}
