// The colour theme, set before the first paint: light, dark, or the system's (prefers-color-scheme), as picked in a
// page's theme menu (a <select data-theme-select>) and kept in localStorage. A classic script in <head>, so that it
// runs before the body is drawn (no flash of the wrong theme) and external, as the Content-Security-Policy allows no
// inline script. It sets <html data-theme="light|dark"> and tells canvases with a "pagedchat:theme" event.
(function () {
  "use strict";
  var KEY = "pagedchat-theme";
  var CHOICES = ["system", "light", "dark"];
  var root = document.documentElement;
  var media = window.matchMedia("(prefers-color-scheme: dark)");

  function storedChoice() {
    try {
      var value = localStorage.getItem(KEY);
      return CHOICES.indexOf(value) >= 0 ? value : "system";
    } catch (e) {
      return "system"; // storage blocked: follow the system
    }
  }

  function apply(choice) {
    var theme = choice === "dark" || (choice === "system" && media.matches) ? "dark" : "light";
    root.setAttribute("data-theme-choice", choice);
    if (root.getAttribute("data-theme") === theme) return;
    root.setAttribute("data-theme", theme);
    document.dispatchEvent(new CustomEvent("pagedchat:theme", { detail: { theme: theme } }));
  }

  function choose(choice) {
    try {
      if (choice === "system") localStorage.removeItem(KEY);
      else localStorage.setItem(KEY, choice);
    } catch (e) {
      // not kept past this page, still applied
    }
    apply(choice);
    syncMenus();
  }

  function syncMenus() {
    var menus = document.querySelectorAll("select[data-theme-select]");
    for (var i = 0; i < menus.length; i++) menus[i].value = root.getAttribute("data-theme-choice");
  }

  apply(storedChoice());
  media.addEventListener("change", function () {
    apply(root.getAttribute("data-theme-choice"));
  });
  // another tab changed it
  window.addEventListener("storage", function (event) {
    if (event.key === KEY || event.key === null) {
      apply(storedChoice());
      syncMenus();
    }
  });
  document.addEventListener("DOMContentLoaded", function () {
    syncMenus();
    document.addEventListener("change", function (event) {
      if (event.target.matches && event.target.matches("select[data-theme-select]")) choose(event.target.value);
    });
  });
})();
