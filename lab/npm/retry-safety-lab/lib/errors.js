"use strict";
// The two ways a lab run goes wrong: the lab could not run, or it ran and a check failed.

/** The lab could not start or stop (no binary, bad input, an upstream that does not answer,
 * a port in use): nothing was verified. */
class LabError extends Error {
  constructor(message) {
    super(message);
    this.name = "LabError";
  }
}

/** The lab ran and its verdict is a failure; `report` holds the counts. */
class LabFailed extends Error {
  constructor(message, report) {
    super(message);
    this.name = "LabFailed";
    this.report = report;
  }
}

module.exports = { LabError, LabFailed };
