// One panel at a time, chosen by a tab; the address's #fragment names it (#transcription), so a
// tab can be linked to and survives a reload.

import { $ } from "./ui.js";

const nav = $("#tabs");
let shown = []; // the panels the server's tasks call for, in page order

export function setTabs(panels) {
  shown = panels;
  nav.replaceChildren(...panels.map(tab));
  select(fromAddress());
}

window.addEventListener("hashchange", () => select(fromAddress()));
nav.addEventListener("click", (event) => {
  const button = event.target.closest("button[data-panel]");
  if (button) location.hash = button.dataset.panel; // hashchange selects it
});

function fromAddress() {
  const wanted = location.hash.slice(1);
  return shown.includes(wanted) ? wanted : shown[0];
}

function select(chosen) {
  for (const panel of document.querySelectorAll("section.panel")) panel.hidden = panel.id !== chosen;
  for (const button of nav.children) button.setAttribute("aria-selected", String(button.dataset.panel === chosen));
}

function tab(panel) {
  const button = document.createElement("button");
  button.type = "button";
  button.role = "tab";
  button.id = `tab-${panel}`;
  button.dataset.panel = panel;
  button.setAttribute("aria-controls", panel);
  button.textContent = $(`#${panel} h2`).textContent;
  return button;
}
