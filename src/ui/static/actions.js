// effectful-durable ui: checks a form's JSON before it is sent.
//
// An approval's edited arguments are checked against the tool's JSON schema (the
// textarea's data-schema) and an event's payload is checked to be JSON
// (data-json): a misfit is shown under the field and the form is not sent. The
// page checks what it can (types, required and unknown keys, enums, bounds,
// lengths, patterns, $ref, anyOf/oneOf/allOf); the library checks every
// decision again, with the whole of JSON Schema, and refuses what does not fit.
// The server never relies on this file.
(function () {
  "use strict";

  function kind(value) {
    if (value === null) return "null";
    if (Array.isArray(value)) return "array";
    return typeof value; // "object", "string", "number", "boolean"
  }

  function isType(value, type) {
    switch (type) {
      case "integer": return typeof value === "number" && Number.isInteger(value);
      case "number": return typeof value === "number";
      case "object": return kind(value) === "object";
      default: return kind(value) === type;
    }
  }

  function article(type) {
    return (/^[aeiou]/.test(type) ? "an " : "a ") + type;
  }

  function equal(a, b) {
    return JSON.stringify(a) === JSON.stringify(b);
  }

  function resolve(root, ref) {
    if (!ref.startsWith("#")) return undefined; // another document: the library checks it
    let node = root;
    for (const part of ref.slice(1).split("/").filter(Boolean)) {
      node = node === undefined ? undefined : node[part.replace(/~1/g, "/").replace(/~0/g, "~")];
    }
    return node;
  }

  function fits(schema, value, root) {
    const problems = [];
    check(schema, value, "", root, problems);
    return problems.length === 0;
  }

  // Adds [path, what is wrong] to problems for each misfit of value to schema.
  function check(schema, value, path, root, problems) {
    if (schema === true || schema === undefined || schema === null) return;
    if (schema === false) { problems.push([path, "is not allowed"]); return; }
    if (typeof schema.$ref === "string") {
      const target = resolve(root, schema.$ref);
      if (target !== undefined) check(target, value, path, root, problems);
    }
    for (const part of schema.allOf || []) check(part, value, path, root, problems);
    if (schema.anyOf && !schema.anyOf.some((s) => fits(s, value, root))) {
      problems.push([path, "fits none of the forms it may take"]);
    }
    if (schema.oneOf && schema.oneOf.filter((s) => fits(s, value, root)).length !== 1) {
      problems.push([path, "must fit exactly one of the forms it may take"]);
    }
    if ("const" in schema && !equal(value, schema.const)) {
      problems.push([path, "must be " + JSON.stringify(schema.const)]);
    }
    if (Array.isArray(schema.enum) && !schema.enum.some((e) => equal(e, value))) {
      problems.push([path, "must be one of " + schema.enum.map((e) => JSON.stringify(e)).join(", ")]);
    }
    if (schema.type !== undefined) {
      const types = [].concat(schema.type);
      if (!types.some((t) => isType(value, t))) {
        problems.push([path, "must be " + types.map(article).join(" or ") +
          ", not " + article(kind(value)) + " (" + JSON.stringify(value) + ")"]);
        return;
      }
    }
    if (typeof value === "number") {
      if (typeof schema.minimum === "number" && value < schema.minimum) problems.push([path, "must be at least " + schema.minimum]);
      if (typeof schema.maximum === "number" && value > schema.maximum) problems.push([path, "must be at most " + schema.maximum]);
      if (typeof schema.exclusiveMinimum === "number" && value <= schema.exclusiveMinimum) problems.push([path, "must be more than " + schema.exclusiveMinimum]);
      if (typeof schema.exclusiveMaximum === "number" && value >= schema.exclusiveMaximum) problems.push([path, "must be less than " + schema.exclusiveMaximum]);
      // As the library computes it (so 0.3 is no multiple of 0.1 there either).
      if (typeof schema.multipleOf === "number" && !Number.isInteger(value / schema.multipleOf)) problems.push([path, "must be a multiple of " + schema.multipleOf]);
    }
    if (typeof value === "string") {
      const length = [...value].length;
      if (typeof schema.minLength === "number" && length < schema.minLength) problems.push([path, "must be at least " + schema.minLength + " characters"]);
      if (typeof schema.maxLength === "number" && length > schema.maxLength) problems.push([path, "must be at most " + schema.maxLength + " characters"]);
      if (typeof schema.pattern === "string") {
        let pattern = null;
        try { pattern = new RegExp(schema.pattern, "u"); } catch (e) { pattern = null; }
        if (pattern && !pattern.test(value)) problems.push([path, "must match " + schema.pattern]);
      }
    }
    if (Array.isArray(value)) {
      const prefix = schema.prefixItems || [];
      value.forEach((item, i) => {
        const itemSchema = i < prefix.length ? prefix[i] : schema.items;
        check(itemSchema, item, path + "[" + i + "]", root, problems);
      });
      if (typeof schema.minItems === "number" && value.length < schema.minItems) problems.push([path, "must hold at least " + schema.minItems + " items"]);
      if (typeof schema.maxItems === "number" && value.length > schema.maxItems) problems.push([path, "must hold at most " + schema.maxItems + " items"]);
    }
    if (kind(value) === "object") {
      const properties = schema.properties || {};
      for (const name of schema.required || []) {
        if (!(name in value)) problems.push([path, "needs the key " + JSON.stringify(name)]);
      }
      for (const [name, item] of Object.entries(value)) {
        const where = path ? path + "." + name : name;
        if (name in properties) {
          check(properties[name], item, where, root, problems);
        } else if (schema.additionalProperties === false) {
          problems.push([where, "is not a parameter of the tool"]);
        } else if (typeof schema.additionalProperties === "object") {
          check(schema.additionalProperties, item, where, root, problems);
        }
      }
    }
  }

  // What is wrong with the JSON text of a field, or "" if nothing is.
  function misfit(field) {
    const text = field.value.trim();
    if (!text) return ""; // empty: the model's arguments, or a null payload
    let value;
    try {
      value = JSON.parse(text);
    } catch (error) {
      return "Not valid JSON: " + error.message;
    }
    if (field.dataset.schema === undefined) return "";
    let schema;
    try {
      schema = JSON.parse(field.dataset.schema);
    } catch (error) {
      return ""; // no schema to check against here: the library checks
    }
    const problems = [];
    check(schema, value, "", schema, problems);
    return problems.map(([path, what]) => (path || "the arguments") + ": " + what).join("; ");
  }

  function show(form, field) {
    const said = misfit(field);
    const place = form.querySelector(".misfit");
    field.setAttribute("aria-invalid", said ? "true" : "false");
    if (place) {
      place.textContent = said ? said + ". Nothing was sent." : "";
      place.hidden = !said;
    }
    return said;
  }

  function watch(form) {
    if (form.dataset.watched) return;
    const field = form.querySelector("textarea[data-schema], textarea[data-json]");
    if (!field) return;
    form.dataset.watched = "1";
    field.addEventListener("input", () => {
      if (field.getAttribute("aria-invalid") === "true") show(form, field);
    });
    form.addEventListener("submit", (event) => {
      if (show(form, field)) {
        event.preventDefault();
        const details = field.closest("details");
        if (details) details.open = true;
        field.focus();
      }
    });
  }

  function start(root) {
    root.querySelectorAll("form").forEach(watch);
    if (root.tagName === "FORM") watch(root);
  }

  // For the tests, which compare this check with the library's on many schemas.
  window.effectfulDurableMisfits = (schema, value) => {
    const problems = [];
    check(schema, value, "", schema, problems);
    return problems;
  };

  document.addEventListener("DOMContentLoaded", () => start(document));
  document.addEventListener("htmx:load", (event) => start(event.target));
})();
