// Small helpers the panels share: finding elements, showing an error, a button busy while it acts.

export const $ = (selector, root = document) => root.querySelector(selector);

export function showError(element, error) {
  element.textContent = error.message || String(error);
  element.hidden = false;
}

export function clearError(element) {
  element.textContent = "";
  element.hidden = true;
}

// Runs `action` with `button` disabled; its error, an API refusal as the API words it, goes to
// `errorElement`. A stop the user asked for (AbortError) is no error.
export async function busy(button, errorElement, action) {
  clearError(errorElement);
  button.disabled = true;
  try {
    return await action();
  } catch (error) {
    if (error.name !== "AbortError") showError(errorElement, error);
  } finally {
    button.disabled = false;
  }
}

// <option>s for every voice: `before`, built-in ones, saved ones (by name, their id as the value),
// `after`; the voice chosen before stays chosen while it exists.
export function fillVoices(select, voices, { before = [], after = [] } = {}) {
  const chosen = select.options.length ? select.value : null;
  select.replaceChildren(...before);
  for (const [label, type] of [["Built-in", "builtin"], ["Saved", "saved"]]) {
    const group = document.createElement("optgroup");
    group.label = label;
    for (const voice of voices.filter((v) => v.type === type)) group.append(new Option(voice.name, voice.id));
    if (group.children.length) select.append(group);
  }
  select.append(...after);
  if ([...select.options].some((option) => option.value === chosen)) select.value = chosen;
}

export function download(link, blob, filename) {
  if (link.href) URL.revokeObjectURL(link.href);
  link.href = URL.createObjectURL(blob);
  link.download = filename;
  link.textContent = `Download ${filename}`;
  link.hidden = false;
}

export function seconds(value) {
  return `${Number(value).toFixed(2)} s`;
}
