// How the pages look and what a person notices: Dark mode applied the moment it is chosen (the server saves it
// through htmx and renders it on <html> from then on, so a page never flashes the other theme).
(function () {
  "use strict";

  document.addEventListener("change", function (event) {
    var target = event.target;
    if (target && target.id === "theme-select") document.documentElement.dataset.theme = target.value;
  });
})();
