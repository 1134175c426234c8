// effectful-durable ui: keeps the folds (<details>) of the page's live part as the
// person left them when a commit refreshes it.
//
// A commit elsewhere makes htmx fetch the page again and replace its live part
// (#live) whole: every fold would come back as the server renders it. Before the
// swap each fold's state is noted under a key (the id of its nearest ancestor that
// has one, its summary's text, and its rank among the folds with both alike), and
// after it the folds found under the same keys get that state back: one the person
// opened stays open, one they closed stays closed. A fold that is new, or whose
// summary changed, shows as the server renders it.
(function () {
  "use strict";

  function folds(root) {
    const ranks = new Map();
    const found = new Map();
    root.querySelectorAll("details").forEach((fold) => {
      const owner = fold.parentElement.closest("[id]");
      const summary = fold.querySelector(":scope > summary");
      const where = (owner ? owner.id : "") + "\u0000" + (summary ? summary.textContent.trim() : "");
      const rank = ranks.get(where) || 0;
      ranks.set(where, rank + 1);
      found.set(where + "\u0000" + rank, fold);
    });
    return found;
  }

  let states = null; // key -> open, noted before the live part's swap

  document.addEventListener("htmx:beforeSwap", (event) => {
    const target = event.detail.target;
    if (!target || target.id !== "live" || !event.detail.shouldSwap) return;
    states = new Map();
    folds(target).forEach((fold, key) => states.set(key, fold.open));
  });

  document.addEventListener("htmx:afterSwap", () => {
    const live = document.getElementById("live");
    if (states === null || live === null) return;
    folds(live).forEach((fold, key) => {
      if (states.has(key)) fold.open = states.get(key);
    });
    states = null;
  });
})();
