// Formatting shared by the pages: UTC times, byte sizes, numbers, CSV.

export function utc(value) {
  if (!value) return "—";
  const date = new Date(value);
  return `${date.toISOString().slice(0, 19).replace("T", " ")} UTC`;
}

export function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

export function number(n, digits = 0) {
  return Number(n).toLocaleString("en-US", { maximumFractionDigits: digits });
}

export function percent(fraction) {
  return `${(fraction * 100).toFixed(1)} %`;
}

function csvCell(value) {
  const text = value === null || value === undefined ? "" : String(value);
  return /[",\n]/.test(text) ? `"${text.replace(/"/g, '""')}"` : text;
}

export function toCsv(columns, rows) {
  const lines = [columns.map((c) => csvCell(c.label)).join(",")];
  for (const row of rows) lines.push(columns.map((c) => csvCell(row[c.key])).join(","));
  return `${lines.join("\n")}\n`;
}

export function download(filename, text, type = "text/csv") {
  const url = URL.createObjectURL(new Blob([text], { type }));
  const link = document.createElement("a");
  link.href = url;
  link.download = filename;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

export function isoDay(date) {
  return date.toISOString().slice(0, 10);
}

// A query parameter of the hash route (#/keys?tenant=3 -> "3").
export function hashParam(name) {
  const query = window.location.hash.split("?")[1] || "";
  return new URLSearchParams(query).get(name);
}
