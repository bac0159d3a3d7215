// ESLint over the front end's ES modules in nbmon/views/js/ (`npm run lint` here; scripts/lint.sh in CI).
// The tools live at the repository's root, not beside the modules: there a node_modules/ would land among
// the package data (pyproject ships views/js/**/*.js) and among the modules tests/test_frontend.py reads.
import js from "@eslint/js";
import globals from "globals";

export default [
  { ignores: ["**/node_modules/", "build/", "dist/"] },
  js.configs.recommended,
  {
    // The widgets' modules, run in the page (anywidget loads each entry joined into one module).
    files: ["nbmon/views/js/**/*.js"],
    languageOptions: { ecmaVersion: "latest", sourceType: "module", globals: globals.browser },
  },
  {
    // node's tests of those modules, and this file.
    files: ["nbmon/views/js/**/*.mjs", "eslint.config.mjs"],
    languageOptions: { ecmaVersion: "latest", sourceType: "module", globals: globals.node },
  },
];
